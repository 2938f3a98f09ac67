using System.Net;
using System.Reflection;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.AspNetCore.Connections;
using Microsoft.AspNetCore.Server.Kestrel.Transport.Sockets;

namespace Kestrel.Transport.Linux.Tests.Transport;

/// <summary>
/// Kestrel's <c>Microsoft.AspNetCore.Server.Kestrel.FinOnError</c> switch, which both transports read once per process
/// into their options: an abort then ends the connection with FIN, not RST. Each test sets the options' copy of it.
/// </summary>
public sealed class FinOnErrorTests(ITestOutputHelper output)
{
    private static readonly IPEndPoint s_loopback = new(IPAddress.Loopback, 0);

    [Theory]
    [MemberData(nameof(Transports.ConnectionLevel), MemberType = typeof(Transports))]
    public async Task With_Kestrels_FinOnError_switch_an_abort_sends_FIN_after_what_was_sent_and_faults_input_with_the_reason(TransportKind kind)
    {
        var transport = TestTransport.Create(kind, output, settings =>
        {
            settings.Linux = options => options.FinOnError = true;
            settings.Sockets = options => typeof(SocketTransportOptions)
                .GetProperty("FinOnError", BindingFlags.Instance | BindingFlags.NonPublic)!
                .SetValue(options, true);
        });
        await using var _ = transport;
        var listener = await transport.BindAsync(s_loopback);
        using var client = await TestSockets.ConnectAsync(listener.EndPoint);
        var connection = await transport.AcceptAsync(listener);

        // A response that went out before the abort must reach the peer whole, then the end of the stream.
        await client.SendAllAsync("ping"u8.ToArray());
        Assert.Equal("ping"u8.ToArray(), await connection.ReadExactlyAsync(4));
        await connection.Transport.Output.WriteAsync("pong"u8.ToArray());
        var pong = new byte[4];
        await client.ReceiveExactlyAsync(pong, TestTimeouts.Default);
        Assert.Equal("pong"u8.ToArray(), pong);

        var closed = connection.WaitForConnectionClosedAsync();
        var pendingRead = connection.Transport.Input.ReadAsync().AsTask();
        var reason = new ConnectionAbortedException("aborted by the test");
        connection.Abort(reason);

        var fault = await Assert.ThrowsAnyAsync<Exception>(() => pendingRead.WaitAsync(TestTimeouts.Default));
        Assert.Same(reason, fault);
        Assert.Equal(0, await client.ReceiveAsync(new byte[16], TestTimeouts.Default));

        await closed;
        await transport.StopAsync();
    }
}
