using System.Globalization;
using System.Net.Security;
using System.Text;
using TechEmpower.Tests.Infrastructure;

namespace TechEmpower.Tests.Endpoints;

/// <summary>
/// The line the sample prints when it stops: the final values of the Linux transport's counters, summed over their tags,
/// in name order, which the benchmarks read (hand-offs per TLS handshake, for one). Nothing on another transport.
/// </summary>
public sealed class ExitCountersTests
{
    private const string Prefix = "kestrel.transport.linux.";

    /// <summary>Each on its own connection, so the accepted count is known exactly.</summary>
    private const int Connections = 5;

    [Theory]
    [InlineData(false, "--transport", "linux")]
    [InlineData(false, "--transport", "linux", "--io", "io_uring")]
    [InlineData(true, "--transport", "linux", "--scheduling", "adaptive")]
    [InlineData(true, "--transport", "linux", "--scheduling", "inline", "--io", "io_uring")]
    public async Task Stopping_prints_the_counters_with_every_accepted_connection(bool https, params string[] transport)
    {
        await using var sample = await SampleProcess.StartAsync(["--urls", https ? "https://127.0.0.1:0" : "http://127.0.0.1:0", .. transport]);
        for (var i = 0; i < Connections; i++)
        {
            await RequestOnNewConnectionAsync(sample.Urls.Single(), https);
        }

        var output = await SampleShutdown.TerminateAsync(sample, TransportCounters.LinePrefix);
        var line = SampleShutdown.Line(output, TransportCounters.LinePrefix);
        Assert.True(line is not null, $"No counters line on exit:{Environment.NewLine}{output}");

        var counters = line[TransportCounters.LinePrefix.Length..].Split(' ')
            .Select(pair => pair.Split('='))
            .Select(pair => (Name: pair[0], Value: long.Parse(pair[1], NumberStyles.None, CultureInfo.InvariantCulture)))
            .ToList();
        Assert.Equal(counters.Select(c => c.Name).Order(StringComparer.Ordinal), counters.Select(c => c.Name));
        Assert.All(counters, c => Assert.StartsWith(Prefix, c.Name, StringComparison.Ordinal));
        var values = counters.ToDictionary(c => c.Name, c => c.Value);

        Assert.Equal(Connections, values[Prefix + "connections.accepted"]);
        Assert.Equal(0, values[Prefix + "accept.errors"]);
        Assert.True(values.ContainsKey(Prefix + "loop.handoffs"), line);
        Assert.True(values[Prefix + "loop.passes"] > 0, line);
        Assert.True(values[Prefix + "bytes"] > 0, line);

        // Left off: not counters (connections.current, the histograms), or recorded per send (zero-copy).
        Assert.DoesNotContain(Prefix + "connections.current", values.Keys);
        Assert.DoesNotContain(Prefix + "pass.events", values.Keys);
        Assert.DoesNotContain(Prefix + "zerocopy.sends", values.Keys);
    }

    [Theory]
    [InlineData("sockets")]
    [InlineData("sockets-inline")]
    public async Task Another_transport_prints_no_counters_line(string transport)
    {
        await using var sample = await SampleProcess.StartAsync(
            ["--urls", "http://127.0.0.1:0", "--transport", transport],
            new Dictionary<string, string?> { ["DOTNET_SYSTEM_NET_SOCKETS_INLINE_COMPLETIONS"] = null });
        await RequestOnNewConnectionAsync(sample.Urls.Single(), https: false);

        var output = await SampleShutdown.TerminateAsync(sample, lastLine: null);

        // The linux cases above show that the line is printed by this same shutdown, and read within the drain time.
        Assert.Null(SampleShutdown.Line(output, TransportCounters.LinePrefix));
    }

    private static async Task RequestOnNewConnectionAsync(string url, bool https)
    {
        using var cts = new CancellationTokenSource(TestTimeouts.Request);
        if (https)
        {
            await using var stream = await TlsClient.SelfSigned().ConnectAsync(url, [SslApplicationProtocol.Http11], cts.Token);
            await stream.WriteAsync(Encoding.ASCII.GetBytes(RawHttpRequest.Get("/plaintext")), cts.Token);
            await TlsClient.ReadResponsesAsync(stream, "Hello, World!", 1, cts.Token);
        }
        else
        {
            await using var connection = await RawHttpConnection.ConnectAsync(url, cts.Token);
            await connection.SendAsync(RawHttpRequest.Get("/plaintext"), cts.Token);
            Assert.Equal(200, (await connection.ReadResponseAsync(cts.Token)).StatusCode);
        }
    }
}
