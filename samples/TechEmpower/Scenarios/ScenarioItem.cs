namespace TechEmpower.Scenarios;

/// <summary>
/// The object the /json-object and /xml scenarios serialize: an id, a string, an int and a list of
/// ten ints. A mutable class with a parameterless constructor, as XmlSerializer requires.
/// </summary>
public sealed class ScenarioItem
{
    /// <summary>A new GUID per request.</summary>
    public Guid Id { get; set; }

    /// <summary>A short string.</summary>
    public string Name { get; set; } = "";

    /// <summary>A number.</summary>
    public int Count { get; set; }

    /// <summary>Ten numbers.</summary>
    [System.Diagnostics.CodeAnalysis.SuppressMessage("Usage", "CA2227:Collection properties should be read only",
        Justification = "XmlSerializer and System.Text.Json both need a setter to round-trip the list.")]
    public List<int> Values { get; set; } = [];

    /// <summary>Builds the object a request serializes.</summary>
    /// <returns>A new item with a fresh id and the values 1 to 10.</returns>
    public static ScenarioItem Create()
    {
        var values = new List<int>(10);
        for (var i = 1; i <= 10; i++)
        {
            values.Add(i);
        }

        return new ScenarioItem { Id = Guid.NewGuid(), Name = "Kestrel", Count = 42, Values = values };
    }
}
