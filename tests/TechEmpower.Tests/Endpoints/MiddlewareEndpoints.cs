using System.Globalization;
using System.Text.Json;
using System.Text.RegularExpressions;
using System.Xml.Linq;
using TechEmpower.Tests.Infrastructure;

namespace TechEmpower.Tests.Endpoints;

/// <summary>
/// Middleware mode: besides plaintext and JSON, the application scenarios of the hosting-model
/// comparisons, served by MVC, each checked by the same header rules and by the body's structure.
/// </summary>
/// <typeparam name="TFixture">The running sample.</typeparam>
/// <param name="sample">The running sample.</param>
public abstract partial class MiddlewareEndpoints<TFixture>(TFixture sample) : SampleEndpoints<TFixture>(sample)
    where TFixture : SampleFixture
{
    [Fact]
    public async Task Text_is_the_Latin_alphabet_and_the_digits()
    {
        using var response = await Sample.Client.GetAsync(new Uri("/text", UriKind.Relative));
        var body = await TechEmpowerRules.VerifyAsync(response, "text/plain");
        Assert.Equal("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", System.Text.Encoding.UTF8.GetString(body));
    }

    /// <summary>300 KiB spans several of the action's writes and many of the transport's sends.</summary>
    [Fact]
    public async Task Download_is_the_requested_number_of_pattern_bytes()
    {
        using var response = await Sample.Client.GetAsync(new Uri("/download/300", UriKind.Relative));
        var body = await TechEmpowerRules.VerifyAsync(response, "application/octet-stream");
        Assert.Equal(300 * 1024, body.Length);
        int wrong = Enumerable.Range(0, body.Length).FirstOrDefault(i => body[i] != (byte)(i % 251), -1);
        Assert.Equal(-1, wrong);
    }

    [Theory]
    [InlineData("/download/0")]
    [InlineData("/download/16385")]
    [InlineData("/download/x")]
    public async Task Download_sizes_outside_1_to_16384_KiB_are_not_found(string path)
    {
        using var response = await Sample.Client.GetAsync(new Uri(path, UriKind.Relative));
        Assert.Equal(System.Net.HttpStatusCode.NotFound, response.StatusCode);
    }

    [Fact]
    public async Task Json_object_has_a_guid_a_string_an_int_and_ten_ints()
    {
        using var response = await Sample.Client.GetAsync(new Uri("/json-object", UriKind.Relative));
        var body = await TechEmpowerRules.VerifyAsync(response, "application/json");

        using var document = JsonDocument.Parse(body);
        var root = document.RootElement;
        Assert.Equal(JsonValueKind.Object, root.ValueKind);
        Assert.Equal(["count", "id", "name", "values"], root.EnumerateObject().Select(p => p.Name).Order(StringComparer.Ordinal));
        Assert.True(Guid.TryParse(root.GetProperty("id").GetString(), out _));
        Assert.False(string.IsNullOrEmpty(root.GetProperty("name").GetString()));
        Assert.True(root.GetProperty("count").TryGetInt32(out _));
        var values = root.GetProperty("values").EnumerateArray().ToList();
        Assert.Equal(10, values.Count);
        Assert.All(values, v => Assert.True(v.TryGetInt32(out _)));
    }

    [Fact]
    public async Task Json_object_gets_a_new_id_per_request()
    {
        var ids = new HashSet<string>();
        for (var i = 0; i < 2; i++)
        {
            using var response = await Sample.Client.GetAsync(new Uri("/json-object", UriKind.Relative));
            using var document = JsonDocument.Parse(await TechEmpowerRules.VerifyAsync(response, "application/json"));
            ids.Add(document.RootElement.GetProperty("id").GetString()!);
        }

        Assert.Equal(2, ids.Count);
    }

    [Fact]
    public async Task Xml_is_the_same_object_as_xml()
    {
        using var response = await Sample.Client.GetAsync(new Uri("/xml", UriKind.Relative));
        var body = await TechEmpowerRules.VerifyAsync(response, "application/xml");

        using var stream = new MemoryStream(body);
        var root = XDocument.Load(stream).Root!;
        Assert.Equal("ScenarioItem", root.Name.LocalName);
        Assert.Equal(["Count", "Id", "Name", "Values"], root.Elements().Select(e => e.Name.LocalName).Order(StringComparer.Ordinal));
        Assert.True(Guid.TryParse(root.Element("Id")!.Value, out _));
        Assert.False(string.IsNullOrEmpty(root.Element("Name")!.Value));
        Assert.True(int.TryParse(root.Element("Count")!.Value, NumberStyles.Integer, CultureInfo.InvariantCulture, out _));
        var values = root.Element("Values")!.Elements().ToList();
        Assert.Equal(10, values.Count);
        Assert.All(values, v => Assert.True(int.TryParse(v.Value, NumberStyles.Integer, CultureInfo.InvariantCulture, out _)));
    }

    [Fact]
    public async Task Html_view_has_100_buttons_and_10_selects_of_10_options()
    {
        using var response = await Sample.Client.GetAsync(new Uri("/html", UriKind.Relative));
        var html = System.Text.Encoding.UTF8.GetString(await TechEmpowerRules.VerifyAsync(response, "text/html"));

        Assert.Equal(100, Count(html, "<button"));
        Assert.Equal(10, Count(html, "<select"));
        var selects = SelectElement().Matches(html);
        Assert.Equal(10, selects.Count);
        Assert.All(selects, s => Assert.Equal(10, Count(s.Value, "<option")));
    }

    [Fact]
    public async Task Api_test_returns_Test_and_the_current_time()
    {
        using var response = await Sample.Client.GetAsync(new Uri("/api/test", UriKind.Relative));
        var body = System.Text.Encoding.UTF8.GetString(await TechEmpowerRules.VerifyAsync(response, "text/plain"));

        Assert.StartsWith("Test ", body, StringComparison.Ordinal);
        Assert.True(
            DateTime.TryParse(body["Test ".Length..], CultureInfo.InvariantCulture, DateTimeStyles.AssumeUniversal | DateTimeStyles.AdjustToUniversal, out var time),
            $"'{body}' does not end with a date.");
        Assert.InRange(time, DateTime.UtcNow.AddMinutes(-5), DateTime.UtcNow.AddMinutes(5));
    }

    /// <summary>Unmapped without <c>--downstream</c>, as on a build that lacks it: the benchmark skips the scenario on a 404.</summary>
    [Fact]
    public async Task Await_is_not_found_without_a_downstream()
    {
        using var response = await Sample.Client.GetAsync(new Uri("/await", UriKind.Relative));
        Assert.Equal(System.Net.HttpStatusCode.NotFound, response.StatusCode);
    }

    [Fact]
    public async Task App_scenarios_are_served_over_the_unix_socket()
    {
        using var cts = Timeout();
        await using var connection = await RawHttpConnection.ConnectAsync(Sample.UnixUrl, cts.Token);
        await connection.SendAsync(Request("/text") + Request("/html"), cts.Token);

        var text = await connection.ReadResponseAsync(cts.Token);
        TechEmpowerRules.Verify(text, "text/plain");
        Assert.Equal(62, text.Body.Length);

        var html = await connection.ReadResponseAsync(cts.Token);
        TechEmpowerRules.Verify(html, "text/html");
        Assert.Equal(100, Count(html.BodyText, "<button"));
    }

    private static int Count(string text, string value)
    {
        var count = 0;
        for (var at = text.IndexOf(value, StringComparison.Ordinal); at >= 0; at = text.IndexOf(value, at + 1, StringComparison.Ordinal))
        {
            count++;
        }

        return count;
    }

    [GeneratedRegex("<select[^>]*>.*?</select>", RegexOptions.Singleline)]
    private static partial Regex SelectElement();
}
