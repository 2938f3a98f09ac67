using System.Diagnostics;
using System.Net.Sockets;
using Kestrel.Transport.Linux.Reliability.Tests.Infrastructure;
using Microsoft.AspNetCore.Http;

namespace Kestrel.Transport.Linux.Reliability.Tests.Faults;

/// <summary>Clients that vanish without closing are closed by the server's timeouts.</summary>
public sealed class VanishedClientTests(ITestOutputHelper output)
{
    private static readonly TimeSpan s_timeout = TimeSpan.FromSeconds(2);

    // Kestrel checks its timeouts on a 1 s heartbeat; the rest is room for a loaded machine.
    private static readonly TimeSpan s_closeBound = TimeSpan.FromSeconds(10);

    // Earlier than this, the close was not the timeout's doing.
    private static readonly TimeSpan s_notBefore = TimeSpan.FromSeconds(1.5);

    public static TheoryData<TransportKind> Kinds => ReliabilityTransports.Scheduling;

    /// <summary>
    /// Proves that with KeepAliveTimeout and RequestHeadersTimeout at 2 s the server itself closes a client
    /// that connected and sent nothing, one that sent half a request head, and one that went quiet after a
    /// served request, each between 1.5 and 10 s later, while still serving new connections.
    /// </summary>
    [Theory]
    [MemberData(nameof(Kinds))]
    public async Task Clients_that_vanish_are_closed_by_the_keep_alive_and_request_headers_timeouts(TransportKind kind)
    {
        await using var host = await TestHost.StartAsync(
            kind,
            output,
            context =>
            {
                context.Response.ContentLength = 2;
                return context.Response.WriteAsync("ok");
            },
            s => s.Kestrel = k =>
            {
                k.Limits.KeepAliveTimeout = s_timeout;
                k.Limits.RequestHeadersTimeout = s_timeout;
            });

        var silentSince = Stopwatch.StartNew();
        using var silent = await TestSockets.ConnectAsync(host.EndPoint);

        var halfSince = Stopwatch.StartNew();
        using var half = await TestSockets.ConnectAsync(host.EndPoint);
        await half.SendAllAsync("GET /half HTTP/1.1\r\nHost: loc"u8.ToArray());

        using var idle = await LeanConnection.ConnectAsync(host.EndPoint);
        await idle.SendAsync(RawHttpRequest.Bytes("GET", "/"), TestTimeouts.Large);
        Assert.Equal((200, "ok"), await idle.ReadStatusAndBodyAsync(TestTimeouts.Default));
        var idleSince = Stopwatch.StartNew();

        var closes = await Task.WhenAll(
            WaitForServerCloseAsync("sent nothing", silent, silentSince),
            WaitForServerCloseAsync("sent half a request head", half, halfSince),
            WaitForServerCloseAsync("idle after a response", idle.Socket, idleSince));

        // The server goes on serving.
        using var fresh = await LeanConnection.ConnectAsync(host.EndPoint);
        await fresh.SendAsync(RawHttpRequest.Bytes("GET", "/"), TestTimeouts.Large);
        Assert.Equal((200, "ok"), await fresh.ReadStatusAndBodyAsync(TestTimeouts.Default));

        foreach (var (client, elapsed, how) in closes)
        {
            output.WriteLine($"The client that {client} was closed by the server after {elapsed.TotalSeconds:F1} s: {how}.");
            Assert.True(elapsed >= s_notBefore, $"The client that {client} was closed after only {elapsed.TotalSeconds:F1} s, before the {s_timeout.TotalSeconds} s timeout could have fired ({how}).");
        }

        await host.StopAsync();
    }

    private static async Task<(string Client, TimeSpan Elapsed, string How)> WaitForServerCloseAsync(string client, Socket socket, Stopwatch since)
    {
        var received = 0L;
        var buffer = new byte[4096];
        try
        {
            while (true)
            {
                var n = await socket.ReceiveAsync(buffer, s_closeBound - since.Elapsed);
                if (n == 0)
                {
                    return (client, since.Elapsed, $"FIN after {received} byte(s) ({System.Text.Encoding.ASCII.GetString(buffer, 0, (int)Math.Min(received, 12))}...)");
                }

                received += n;
            }
        }
        catch (SocketException e) when (e.SocketErrorCode == SocketError.ConnectionReset)
        {
            return (client, since.Elapsed, $"RST after {received} byte(s)");
        }
        catch (TimeoutException)
        {
            Assert.Fail($"The server had not closed the connection of the client that {client} {s_closeBound.TotalSeconds} s later.");
            throw;
        }
    }
}
