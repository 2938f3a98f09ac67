using System.Globalization;
using System.Net;
using Kestrel.Transport.Linux.Internal;
using Kestrel.Transport.Linux.Interop;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.AspNetCore.Connections;

namespace Kestrel.Transport.Linux.Tests.Transport;

/// <summary>
/// How a connection is registered with its loop's epoll instance, read back from the kernel: the
/// epoll fd's /proc/self/fdinfo lists each registered fd with the events it is armed for now (a
/// one-shot registration that has reported shows none until it is re-armed). The whole connection- and
/// host-level suites also run with one-shot registrations (TransportKind.LinuxOneShot); these tests
/// check that the mode is the one asked for, and what each mode arms when.
/// </summary>
public sealed class RegistrationTests(ITestOutputHelper output)
{
    // epoll_ctl adds EPOLLERR and EPOLLHUP to every registration (epoll_ctl(2)), so fdinfo shows them too.
    private const uint Always = Epoll.EPOLLERR | Epoll.EPOLLHUP;
    private const uint EdgeTriggeredAll = Epoll.EPOLLIN | Epoll.EPOLLOUT | Epoll.EPOLLRDHUP | Epoll.EPOLLET | Always;
    private const uint OneShotRead = Epoll.EPOLLIN | Epoll.EPOLLRDHUP | Epoll.EPOLLONESHOT | Always;

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
    /// A one-shot registration reports once, so every request after the first is read only because
    /// the connection re-armed it; and it is armed for writes only while a send waits for room.
    /// </summary>
    [Theory]
    [MemberData(nameof(Transports.LinuxOnly), MemberType = typeof(Transports))]
    public async Task With_OneShotRegistrations_the_connection_rearms_reads_after_each_event_and_writes_only_while_a_send_waits(TransportKind kind)
    {
        const int Length = 8 * 1024 * 1024;
        const ulong Seed = 5;
        await using var transport = TestTransport.Create(kind, output, s =>
        {
            // The whole response fits in the pipe, so the app never waits on the client.
            s.MaxWriteBufferSize = null;
            s.Linux = o => o.OneShotRegistrations = true;
        });
        var (client, connection, factory) = await ConnectAsync(transport);
        using var _ = client;

        Assert.Equal(OneShotRead, RegisteredEvents(factory, connection.Fd));
        for (int i = 0; i < 3; i++)
        {
            await EchoAsync(client, connection, i);
            await WaitForEventsAsync(factory, connection.Fd, OneShotRead);
        }

        // The client reads nothing: the socket's send buffer fills and the rest waits for EPOLLOUT.
        await WriteAsync(connection, Seed, Length);

        await WaitForEventsAsync(factory, connection.Fd, OneShotRead | Epoll.EPOLLOUT);

        await ReceiveAndCheckAsync(client, Seed, Length);
        await WaitForEventsAsync(factory, connection.Fd, OneShotRead);

        // The read side still works after the write wait.
        await EchoAsync(client, connection, 3);
        await transport.StopAsync();
    }

    /// <summary>
    /// An event disarms the whole registration, also when it leads to no read: here new data arrives
    /// while the app's input is full (backpressure) and a send waits for room. The connection must
    /// re-arm for writes at once, or the response never finishes.
    /// </summary>
    [Theory]
    [MemberData(nameof(Transports.LinuxOnly), MemberType = typeof(Transports))]
    public async Task With_OneShotRegistrations_data_arriving_under_backpressure_keeps_a_waiting_send_armed(TransportKind kind)
    {
        const int Length = 8 * 1024 * 1024;
        const ulong Seed = 9;
        await using var transport = TestTransport.Create(kind, output, s =>
        {
            s.MaxReadBufferSize = 1024;
            s.MaxWriteBufferSize = null;
            s.Linux = o => o.OneShotRegistrations = true;
        });
        var (client, connection, factory) = await ConnectAsync(transport);
        using var _ = client;

        // The loop reads it all at once and its flush waits for the app: armed for reads again.
        byte[] first = TestData.Create(1, 2000);
        await client.SendAllAsync(first);
        await WaitForEventsAsync(factory, connection.Fd, OneShotRead);

        await WriteAsync(connection, Seed, Length);

        await WaitForEventsAsync(factory, connection.Fd, OneShotRead | Epoll.EPOLLOUT);

        // This arrival is reported, and not read (the input is full): only the send is left to wait on.
        byte[] second = TestData.Create(2, 10);
        await client.SendAllAsync(second);
        await WaitForEventsAsync(factory, connection.Fd, Epoll.EPOLLOUT | Epoll.EPOLLONESHOT | Always);

        await ReceiveAndCheckAsync(client, Seed, Length);

        byte[] arrived = await connection.ReadExactlyAsync(first.Length + second.Length);
        Assert.Equal([.. first, .. second], arrived);
        await WaitForEventsAsync(factory, connection.Fd, OneShotRead);
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
    /// The loop re-arms after it has handled the event, which may be just after the app saw the data
    /// or the client received its bytes: wait for the mask, and report the last one seen.
    /// </summary>
    private static async Task WaitForEventsAsync(LinuxTransportFactory factory, int fd, uint expected)
    {
        var deadline = DateTime.UtcNow + TestTimeouts.Default;
        uint? events;
        while ((events = RegisteredEvents(factory, fd)) != expected && DateTime.UtcNow < deadline)
        {
            await Task.Delay(10);
        }

        Assert.True(events == expected, $"fd {fd} is armed for 0x{events:x}, expected 0x{expected:x}.");
    }

    /// <summary>
    /// The events <paramref name="fd"/> is registered for in whichever loop's epoll instance holds it
    /// (fdinfo line "tfd: FD events: HEX data: ..."), or null when none does.
    /// </summary>
    private static uint? RegisteredEvents(LinuxTransportFactory factory, int fd)
    {
        foreach (var loop in factory.Loops)
        {
            foreach (string line in File.ReadAllLines($"/proc/self/fdinfo/{loop.EpollFd}"))
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
