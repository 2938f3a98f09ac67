namespace TechEmpower.Scenarios;

/// <summary>The /html view's model: 100 buttons and 10 select lists of 10 options each, built per request.</summary>
public sealed class HtmlPageModel
{
    /// <summary>The number of buttons the page shows.</summary>
    public const int ButtonCount = 100;

    /// <summary>The number of select lists the page shows.</summary>
    public const int SelectCount = 10;

    /// <summary>The number of options in each select list.</summary>
    public const int OptionsPerSelect = 10;

    private HtmlPageModel(DateTime renderedAtUtc, IReadOnlyList<string> buttons, IReadOnlyList<HtmlSelect> selects)
    {
        RenderedAtUtc = renderedAtUtc;
        Buttons = buttons;
        Selects = selects;
    }

    /// <summary>When the model was built, shown on the page.</summary>
    public DateTime RenderedAtUtc { get; }

    /// <summary>The buttons' labels.</summary>
    public IReadOnlyList<string> Buttons { get; }

    /// <summary>The select lists.</summary>
    public IReadOnlyList<HtmlSelect> Selects { get; }

    /// <summary>Builds the model for one request.</summary>
    /// <returns>A new model.</returns>
    public static HtmlPageModel Create()
    {
        var buttons = new string[ButtonCount];
        for (var i = 0; i < buttons.Length; i++)
        {
            buttons[i] = $"Button {i + 1}";
        }

        var selects = new HtmlSelect[SelectCount];
        for (var s = 0; s < selects.Length; s++)
        {
            var options = new HtmlOption[OptionsPerSelect];
            for (var o = 0; o < options.Length; o++)
            {
                options[o] = new HtmlOption($"{s + 1}-{o + 1}", $"Option {o + 1}", o == 0);
            }

            selects[s] = new HtmlSelect($"select{s + 1}", $"List {s + 1}", options);
        }

        return new HtmlPageModel(DateTime.UtcNow, buttons, selects);
    }
}

/// <summary>One select list of the /html view.</summary>
/// <param name="Name">The element's name and id.</param>
/// <param name="Label">The label shown before it.</param>
/// <param name="Options">Its options.</param>
public sealed record HtmlSelect(string Name, string Label, IReadOnlyList<HtmlOption> Options);

/// <summary>One option of a select list.</summary>
/// <param name="Value">The submitted value.</param>
/// <param name="Text">The text shown.</param>
/// <param name="Selected">Whether it is selected initially.</param>
public sealed record HtmlOption(string Value, string Text, bool Selected);
