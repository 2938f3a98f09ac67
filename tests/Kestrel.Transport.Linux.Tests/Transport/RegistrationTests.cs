using System.Globalization;
using System.Net;
using Kestrel.Transport.Linux.Connection;
using Kestrel.Transport.Linux.Engines;
using Kestrel.Transport.Linux.Hosting;
using Kestrel.Transport.Linux.Interop;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.AspNetCore.Connections;

namespace Kestrel.Transport.Linux.Tests.Transport;

/// <summary>
/// How a connection is registered with its loop's epoll instance, read back from the kernel: the
/// epoll fd's /proc/self/fdinfo lists each registered fd with the events it is armed for now. A
/// connection is registered once, edge-triggered, for everything it will wait on, and never re-armed.
/// </summary>
public sealed class RegistrationTests(ITestOutputHelper output)
{
    // epoll_ctl adds EPOLLERR and EPOLLHUP to every registration (epoll_ctl(2)), so fdinfo shows them too.
    private const uint Always = Epoll.EPOLLERR | Epoll.EPOLLHUP;
    private const uint EdgeTriggeredAll = Epoll.EPOLLIN | Epoll.EPOLLOUT | Epoll.EPOLLRDHUP | Epoll.EPOLLET | Always;

    [Theory]
    [MemberData(nameof(Transports.LinuxOnly), MemberType = typeof(Transports))]
    public async Task By_default_a_connection_is_registered_once_edge_triggered_for_reads_and_writes(TransportKind kind)
    {
        await using var transport = TestTransport.Create(kind, output);
        var (client, connection, factory) = await ConnectAsync(transport);
        using var _ = client;

        Assert.Equal(EdgeTriggeredAll, RegisteredEvents(factory, connection.Fd));
        for (int i = 0; i < 3; i++)
        {
            await EchoAsync(client, connection, i);
            Assert.Equal(EdgeTriggeredAll, RegisteredEvents(factory, connection.Fd));
        }

        await transport.StopAsync();
    }

    /// <summary>
    /// A send the socket cannot take whole waits for the EPOLLOUT edge of the same registration: nothing is
    /// re-armed or modified while it waits, and the connection reads and writes as before once it is done.
    /// </summary>
    [Theory]
    [MemberData(nameof(Transports.LinuxOnly), MemberType = typeof(Transports))]
    public async Task A_send_that_waits_for_room_leaves_the_registration_as_it_was(TransportKind kind)
    {
        // Far more than loopback's socket buffers hold (tcp_wmem and tcp_rmem top out at a few MiB), so
        // the send has to wait for the client.
        const int Length = 32 * 1024 * 1024;
        const ulong Seed = 5;
        await using var transport = TestTransport.Create(kind, output, s => s.MaxWriteBufferSize = null);
        var (client, connection, factory) = await ConnectAsync(transport);
        using var _ = client;

        await WriteAsync(connection, Seed, Length);
        Assert.Equal(EdgeTriggeredAll, RegisteredEvents(factory, connection.Fd));

        await ReceiveAndCheckAsync(client, Seed, Length);
        Assert.Equal(EdgeTriggeredAll, RegisteredEvents(factory, connection.Fd));
        await EchoAsync(client, connection, 3);
        await transport.StopAsync();
    }

    private static async Task<(System.Net.Sockets.Socket Client, LinuxConnection Connection, LinuxTransportFactory Factory)> ConnectAsync(TestTransport transport)
    {
        var listener = await transport.BindAsync(new IPEndPoint(IPAddress.Loopback, 0));
        var client = await TestSockets.ConnectAsync(listener.EndPoint);
        var connection = Assert.IsType<LinuxConnection>(await transport.AcceptAsync(listener));
        return (client, connection, (LinuxTransportFactory)transport.Factory);
    }

    /// <summary>The app writes <paramref name="length"/> bytes of test data; the pipe takes them all (MaxWriteBufferSize null).</summary>
    private static async Task WriteAsync(ConnectionContext connection, ulong seed, int length)
    {
        var chunk = new byte[64 * 1024];
        for (int position = 0; position < length; position += chunk.Length)
        {
            int size = Math.Min(chunk.Length, length - position);
            TestData.Fill(seed, position, chunk.AsSpan(0, size));
            await connection.Transport.Output.WriteAsync(chunk.AsMemory(0, size)).AsTask().WaitAsync(TestTimeouts.Default);
        }
    }

    private static async Task ReceiveAndCheckAsync(System.Net.Sockets.Socket client, ulong seed, int length)
    {
        var received = new byte[length];
        await client.ReceiveExactlyAsync(received, TestTimeouts.Large);
        Assert.True(received.AsSpan().SequenceEqual(TestData.Create(seed, length)), "The response arrived corrupted.");
    }

    /// <summary>The app echoes one short message back; the client checks it.</summary>
    private static async Task EchoAsync(System.Net.Sockets.Socket client, ConnectionContext connection, int round)
    {
        byte[] message = System.Text.Encoding.ASCII.GetBytes($"ping {round}");
        await client.SendAllAsync(message);
        Assert.Equal(message, await connection.ReadExactlyAsync(message.Length));

        await connection.Transport.Output.WriteAsync(message).AsTask().WaitAsync(TestTimeouts.Default);
        var echoed = new byte[message.Length];
        await client.ReceiveExactlyAsync(echoed, TestTimeouts.Default);
        Assert.Equal(message, echoed);
    }

    /// <summary>
    /// The events <paramref name="fd"/> is registered for in whichever loop's epoll instance holds it
    /// (fdinfo line "tfd: FD events: HEX data: ..."), or null when none does.
    /// </summary>
    private static uint? RegisteredEvents(LinuxTransportFactory factory, int fd)
    {
        foreach (var loop in factory.Loops)
        {
            foreach (string line in File.ReadAllLines($"/proc/self/fdinfo/{((EpollEngine)loop.Engine).EpollFd}"))
            {
                string[] fields = line.Split(' ', StringSplitOptions.RemoveEmptyEntries);
                if (fields is ["tfd:", var tfd, "events:", var events, ..] && int.Parse(tfd, CultureInfo.InvariantCulture) == fd)
                {
                    return uint.Parse(events, NumberStyles.HexNumber, CultureInfo.InvariantCulture);
                }
            }
        }

        return null;
    }
}
