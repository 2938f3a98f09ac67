using System.Diagnostics;
using System.Net;
using System.Text;
using TechEmpower.Tests.Infrastructure;

namespace TechEmpower.Tests.Endpoints;

/// <summary>
/// What every transport and mode must do: the TechEmpower plaintext and JSON tests as the verifier
/// checks them, pipelining as the plaintext benchmark sends it, a Date that moves, and the same
/// service over the Unix socket the benchmark's nginx uses.
/// </summary>
/// <typeparam name="TFixture">The running sample.</typeparam>
/// <param name="sample">The running sample.</param>
public abstract class SampleEndpoints<TFixture>(TFixture sample) : IClassFixture<TFixture>
    where TFixture : SampleFixture
{
    /// <summary>TechEmpower's plaintext body.</summary>
    protected const string HelloWorld = "Hello, World!";

    /// <summary>TechEmpower's JSON body, byte for byte.</summary>
    protected const string HelloWorldJson = """{"message":"Hello, World!"}""";

    /// <summary>The running sample.</summary>
    protected TFixture Sample { get; } = sample;

    /// <summary>A request as TechEmpower's pipelining load generator sends it.</summary>
    /// <param name="path">The path.</param>
    /// <returns>The request's bytes as text.</returns>
    protected static string Request(string path) =>
        $"GET {path} HTTP/1.1\r\nHost: tfb-server:8080\r\nAccept: text/plain,text/html;q=0.9,application/xhtml+xml;q=0.9,"
        + "application/xml;q=0.8,*/*;q=0.7\r\nConnection: keep-alive\r\n\r\n";

    /// <summary>A token that cancels after <see cref="TestTimeouts.Request"/>.</summary>
    /// <returns>The source; dispose it.</returns>
    protected static CancellationTokenSource Timeout() => new(TestTimeouts.Request);

    [Fact]
    public void Startup_line_names_the_transport_the_mode_and_the_bound_urls()
    {
        var line = Sample.Sample.StartupLine;
        Assert.Matches(Sample.ExpectedTransport, line);
        Assert.Contains($" mode={Sample.Mode} ", line, StringComparison.Ordinal);
        Assert.DoesNotContain(":0", Sample.TcpUrl, StringComparison.Ordinal);
        Assert.Equal($"http://unix:{Sample.UnixSocketPath}", Sample.UnixUrl);
    }

    [Fact]
    public async Task Plaintext_follows_the_TechEmpower_rules()
    {
        using var response = await Sample.Client.GetAsync(new Uri("/plaintext", UriKind.Relative));
        var body = await TechEmpowerRules.VerifyAsync(response, "text/plain");
        Assert.Equal(HelloWorld, Encoding.UTF8.GetString(body));
        Assert.NotNull(response.Content.Headers.ContentLength);
    }

    [Fact]
    public async Task Json_follows_the_TechEmpower_rules()
    {
        using var response = await Sample.Client.GetAsync(new Uri("/json", UriKind.Relative));
        var body = await TechEmpowerRules.VerifyAsync(response, "application/json");
        Assert.Equal(HelloWorldJson, Encoding.UTF8.GetString(body));
    }

    [Fact]
    public async Task Sixteen_pipelined_plaintext_requests_in_one_write_are_all_answered()
    {
        using var cts = Timeout();
        await using var connection = await RawHttpConnection.ConnectAsync(Sample.TcpUrl, cts.Token);
        await connection.SendAsync(string.Concat(Enumerable.Repeat(Request("/plaintext"), 16)), cts.Token);

        for (var i = 0; i < 16; i++)
        {
            var response = await connection.ReadResponseAsync(cts.Token);
            TechEmpowerRules.Verify(response, "text/plain");
            Assert.Equal(HelloWorld, response.BodyText);
        }
    }

    [Fact]
    public async Task Pipelined_requests_are_answered_in_request_order()
    {
        using var cts = Timeout();
        await using var connection = await RawHttpConnection.ConnectAsync(Sample.TcpUrl, cts.Token);
        var paths = Enumerable.Range(0, 16).Select(i => i % 3 == 0 ? "/json" : "/plaintext").ToList();
        await connection.SendAsync(string.Concat(paths.Select(Request)), cts.Token);

        foreach (var path in paths)
        {
            var response = await connection.ReadResponseAsync(cts.Token);
            if (path == "/json")
            {
                TechEmpowerRules.Verify(response, "application/json");
                Assert.Equal(HelloWorldJson, response.BodyText);
            }
            else
            {
                TechEmpowerRules.Verify(response, "text/plain");
                Assert.Equal(HelloWorld, response.BodyText);
            }
        }
    }

    [Fact]
    public async Task Date_changes_after_3_seconds()
    {
        // The fixture's first response is the "before"; usually 3 s have passed by the time this runs.
        var remaining = TimeSpan.FromSeconds(3.2) - Stopwatch.GetElapsedTime(Sample.FirstDateTimestamp);
        if (remaining > TimeSpan.Zero)
        {
            await Task.Delay(remaining);
        }

        using var response = await Sample.Client.GetAsync(new Uri("/plaintext", UriKind.Relative));
        await TechEmpowerRules.VerifyAsync(response, "text/plain");
        Assert.NotEqual(Sample.FirstDate, response.Headers.NonValidated["Date"].ToString());
    }

    [Fact]
    public async Task Unknown_path_is_404()
    {
        using var response = await Sample.Client.GetAsync(new Uri("/no-such-path", UriKind.Relative));
        Assert.Equal(HttpStatusCode.NotFound, response.StatusCode);
    }

    [Fact]
    public async Task Plaintext_and_json_are_served_over_the_unix_socket()
    {
        using var cts = Timeout();
        await using var connection = await RawHttpConnection.ConnectAsync(Sample.UnixUrl, cts.Token);
        await connection.SendAsync(Request("/plaintext") + Request("/json"), cts.Token);

        var plaintext = await connection.ReadResponseAsync(cts.Token);
        TechEmpowerRules.Verify(plaintext, "text/plain");
        Assert.Equal(HelloWorld, plaintext.BodyText);

        var json = await connection.ReadResponseAsync(cts.Token);
        TechEmpowerRules.Verify(json, "application/json");
        Assert.Equal(HelloWorldJson, json.BodyText);
    }
}
