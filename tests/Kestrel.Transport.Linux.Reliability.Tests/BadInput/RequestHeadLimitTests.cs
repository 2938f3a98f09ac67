using System.Text;
using Microsoft.AspNetCore.Http;

namespace Kestrel.Transport.Linux.Reliability.Tests.BadInput;

/// <summary>Request heads past Kestrel's limits or with bytes HTTP forbids, whole and in small pieces, on one loop.</summary>
public sealed class RequestHeadLimitTests(ITestOutputHelper output)
{
    public static TheoryData<TransportKind> Kinds =>
        new() { TransportKind.Sockets, TransportKind.LinuxNative, TransportKind.LinuxInline, TransportKind.LinuxManaged, TransportKind.LinuxIoUring };

    private static IEnumerable<(string Name, byte[] Request, int Status)> Cases()
    {
        static byte[] Ascii(string text) => Encoding.Latin1.GetBytes(text);
        var manyHeaders = string.Concat(Enumerable.Range(0, 150).Select(i => $"X-H{i}: {i}\r\n"));
        var bigHeaders = string.Concat(Enumerable.Range(0, 40).Select(i => $"X-Big{i}: {new string('b', 1000)}\r\n"));

        yield return ("request line over MaxRequestLineSize (8 KB)", Ascii($"GET /{new string('a', 9000)} HTTP/1.1\r\nHost: localhost\r\n\r\n"), 414);
        yield return ("headers over MaxRequestHeadersTotalSize (32 KB)", Ascii($"GET / HTTP/1.1\r\nHost: localhost\r\n{bigHeaders}\r\n"), 431);
        yield return ("150 headers, over MaxRequestHeaderCount (100)", Ascii($"GET / HTTP/1.1\r\nHost: localhost\r\n{manyHeaders}\r\n"), 431);
        yield return ("non-ASCII in a header name", Ascii("GET / HTTP/1.1\r\nHost: localhost\r\nX-T\u00e9st: 1\r\n\r\n"), 400);
        yield return ("NUL in a header value", Ascii("GET / HTTP/1.1\r\nHost: localhost\r\nX-A: a\0b\r\n\r\n"), 400);
        yield return ("bare LF in a header name", Ascii("GET / HTTP/1.1\r\nHost: localhost\r\nX-\nA: 1\r\n\r\n"), 400);
        yield return ("bare CR in a header name", Ascii("GET / HTTP/1.1\r\nHost: localhost\r\nX-\rA: 1\r\n\r\n"), 400);
        yield return ("NUL in the request target", Ascii("GET /a\0b HTTP/1.1\r\nHost: localhost\r\n\r\n"), 400);
        yield return ("non-ASCII in the method", Ascii("G\u00c9T / HTTP/1.1\r\nHost: localhost\r\n\r\n"), 400);
        yield return ("space before the colon", Ascii("GET / HTTP/1.1\r\nHost: localhost\r\nX-A : 1\r\n\r\n"), 400);
    }

    /// <summary>
    /// Each case, sent whole and then in 700-byte pieces, gets exactly the status Kestrel assigns (414, 431 or 400)
    /// followed by the server closing the connection; after each, a healthy keep-alive connection on the same loop
    /// (ThreadCount = 1) is still served.
    /// </summary>
    [Theory]
    [MemberData(nameof(Kinds))]
    public async Task Oversized_or_invalid_request_heads_get_Kestrels_4xx_and_the_same_loop_keeps_serving(TransportKind kind)
    {
        await using var host = await TestHost.StartAsync(kind, output, context => context.Response.WriteAsync("ok"), s => s.Linux = o => o.ThreadCount = 1);
        using var healthy = new RawHttpConnection(await TestSockets.ConnectAsync(host.EndPoint));
        var checkedCases = 0;
        foreach (var (name, request, status) in Cases())
        {
            foreach (var pieceSize in new[] { request.Length, 700 })
            {
                var pieces = request.Chunk(pieceSize).ToArray();

                // No FIN from the client: the server must decide to answer and close by itself.
                var outcome = await RawExchange.RunAsync(host.EndPoint, pieces, delayMilliseconds: 1, TimeSpan.FromSeconds(10));
                Assert.True(outcome.Class == $"{status} close", $"{kind}, {name} in {pieces.Length} send(s): expected '{status} close', got '{outcome.Class}' ({outcome.End}) {outcome.Malformed}");
                checkedCases++;

                await healthy.SendAsync(RawHttpRequest.Get("/healthy"), TestTimeouts.Default);
                var response = await healthy.ReadResponseAsync(TestTimeouts.Default);
                Assert.Equal(200, response.StatusCode);
                Assert.Equal("ok", response.BodyText);
            }
        }

        output.WriteLine($"{kind}: {checkedCases} bad heads answered as Kestrel does, the healthy connection served after each.");
        await host.StopAsync();
    }
}
