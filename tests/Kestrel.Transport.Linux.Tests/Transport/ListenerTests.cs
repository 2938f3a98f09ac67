using System.Net;
using System.Net.Sockets;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.AspNetCore.Connections;

namespace Kestrel.Transport.Linux.Tests.Transport;

/// <summary>Binding, unbinding and the endpoint kinds Kestrel may hand a transport.</summary>
public sealed class ListenerTests(ITestOutputHelper output)
{
    private static readonly IPEndPoint s_loopback = new(IPAddress.Loopback, 0);

    [Theory]
    [MemberData(nameof(Transports.ConnectionLevel), MemberType = typeof(Transports))]
    public async Task Binding_port_0_reports_the_assigned_port_in_EndPoint(TransportKind kind)
    {
        await using var transport = TestTransport.Create(kind, output);
        var listener = await transport.BindAsync(s_loopback);

        var endPoint = Assert.IsType<IPEndPoint>(listener.EndPoint);
        Assert.Equal(IPAddress.Loopback, endPoint.Address);
        Assert.NotEqual(0, endPoint.Port);

        using var client = await TestSockets.ConnectAsync(endPoint);
        var connection = await transport.AcceptAsync(listener);
        Assert.Equal(client.LocalEndPoint, connection.RemoteEndPoint);
        await connection.AssertEchoOnceAsync(client);
        await transport.StopAsync();
    }

    [Theory]
    [MemberData(nameof(Transports.ConnectionLevel), MemberType = typeof(Transports))]
    public async Task UnbindAsync_makes_a_pending_AcceptAsync_return_null(TransportKind kind)
    {
        await using var transport = TestTransport.Create(kind, output);
        var listener = await transport.BindAsync(s_loopback);

        var accept = listener.AcceptAsync().AsTask();
        Assert.False(accept.IsCompleted);
        await listener.UnbindAsync().AsTask().WaitAsync(TestTimeouts.Default);

        Assert.Null(await accept.WaitAsync(TestTimeouts.Default));
        Assert.True(await TestSockets.IsRefusedAsync(listener.EndPoint), "The port still accepts connections after UnbindAsync.");
        await transport.StopAsync(expectRentals: false);
    }

    [Theory]
    [MemberData(nameof(Transports.ConnectionLevel), MemberType = typeof(Transports))]
    public async Task Binding_a_port_held_by_a_plain_listening_socket_throws_AddressInUseException(TransportKind kind)
    {
        using var holder = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
        holder.Bind(s_loopback);
        holder.Listen();
        var taken = (IPEndPoint)holder.LocalEndPoint!;

        await using var transport = TestTransport.Create(kind, output);
        await Assert.ThrowsAsync<AddressInUseException>(() => transport.BindAsync(taken));

        // The failed bind must not have left a socket behind that steals the holder's connections.
        using var client = await TestSockets.ConnectAsync(taken);
        using var accepted = await holder.AcceptAsync().WaitAsync(TestTimeouts.Default);
        await transport.StopAsync(expectRentals: false);
    }

    [Theory]
    [MemberData(nameof(Transports.ConnectionLevel), MemberType = typeof(Transports))]
    public async Task A_second_server_of_the_same_transport_cannot_share_a_bound_port(TransportKind kind)
    {
        // SO_REUSEPORT lets any socket of the same user join a port that was bound with it, so a transport that
        // uses it must still refuse a second server: two Kestrel instances silently splitting traffic is a bug.
        await using var first = TestTransport.Create(kind, output);
        var listener = await first.BindAsync(s_loopback);

        await using var second = TestTransport.Create(kind, output);
        await Assert.ThrowsAsync<AddressInUseException>(() => second.BindAsync(listener.EndPoint));

        // Every connection still goes to the first server, on each of its loops.
        for (var i = 0; i < 8; i++)
        {
            using var client = await TestSockets.ConnectAsync(listener.EndPoint);
            var connection = await first.AcceptAsync(listener);
            await connection.AssertEchoOnceAsync(client);
        }

        await second.StopAsync(expectRentals: false);
        await first.StopAsync();
    }

    [IPv6Theory]
    [MemberData(nameof(Transports.ConnectionLevel), MemberType = typeof(Transports))]
    public async Task IPv6_loopback_accepts_and_echoes(TransportKind kind)
    {
        await using var transport = TestTransport.Create(kind, output);
        var listener = await transport.BindAsync(new IPEndPoint(IPAddress.IPv6Loopback, 0));
        var endPoint = Assert.IsType<IPEndPoint>(listener.EndPoint);
        Assert.Equal(IPAddress.IPv6Loopback, endPoint.Address);
        Assert.NotEqual(0, endPoint.Port);

        using var client = await TestSockets.ConnectAsync(endPoint);
        var connection = await transport.AcceptAsync(listener);
        Assert.Equal(client.LocalEndPoint, connection.RemoteEndPoint);
        await connection.AssertEchoOnceAsync(client);
        await transport.StopAsync();
    }

    [IPv6Theory]
    [MemberData(nameof(Transports.ConnectionLevel), MemberType = typeof(Transports))]
    public async Task IPv6Any_is_dual_stack_so_an_IPv4_client_can_connect(TransportKind kind)
    {
        await using var transport = TestTransport.Create(kind, output);
        var listener = await transport.BindAsync(new IPEndPoint(IPAddress.IPv6Any, 0));
        var port = Assert.IsType<IPEndPoint>(listener.EndPoint).Port;
        Assert.NotEqual(0, port);

        using (var v4 = await TestSockets.ConnectAsync(new IPEndPoint(IPAddress.Loopback, port)))
        {
            var connection = await transport.AcceptAsync(listener);
            var remote = Assert.IsType<IPEndPoint>(connection.RemoteEndPoint);
            var clientAddress = ((IPEndPoint)v4.LocalEndPoint!).Address;
            Assert.True(
                remote.Address.Equals(clientAddress) || remote.Address.Equals(clientAddress.MapToIPv6()),
                $"RemoteEndPoint {remote} does not name the IPv4 client {v4.LocalEndPoint}.");
            await connection.AssertEchoOnceAsync(v4);
        }

        using (var v6 = await TestSockets.ConnectAsync(new IPEndPoint(IPAddress.IPv6Loopback, port)))
        {
            var connection = await transport.AcceptAsync(listener);
            await connection.AssertEchoOnceAsync(v6);
        }

        await transport.StopAsync();
    }

    [Theory]
    [MemberData(nameof(Transports.ConnectionLevel), MemberType = typeof(Transports))]
    public async Task A_unix_domain_socket_accepts_and_echoes(TransportKind kind)
    {
        var directory = Directory.CreateTempSubdirectory("ktl-uds-");
        try
        {
            var endPoint = new UnixDomainSocketEndPoint(Path.Combine(directory.FullName, "kestrel.sock"));
            await using var transport = TestTransport.Create(kind, output);
            var listener = await transport.BindAsync(endPoint);
            Assert.Equal(endPoint.ToString(), listener.EndPoint.ToString());

            for (var i = 0; i < 4; i++)
            {
                using var client = await TestSockets.ConnectAsync(endPoint);
                var connection = await transport.AcceptAsync(listener);
                await connection.AssertEchoOnceAsync(client);
            }

            await transport.StopAsync();
        }
        finally
        {
            directory.Delete(recursive: true);
        }
    }

    /// <summary>
    /// A handle (systemd socket activation, a parent process) stays its owner's, as with the Sockets transport: the
    /// transport listens on it, even when it was only bound, and leaves it open when it is done, so that the owner can
    /// bind it again or close it itself.
    /// </summary>
    [Theory]
    [MemberData(nameof(Transports.ConnectionLevel), MemberType = typeof(Transports))]
    public async Task A_FileHandleEndPoint_listens_on_the_socket_it_is_given_and_leaves_it_to_its_owner(TransportKind kind)
    {
        using var socket = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
        socket.Bind(s_loopback);
        var address = (IPEndPoint)socket.LocalEndPoint!;
        var handle = new FileHandleEndPoint((ulong)socket.Handle, FileHandleType.Tcp);

        for (int round = 0; round < 2; round++)
        {
            await using var transport = TestTransport.Create(kind, output);
            var listener = await transport.BindAsync(handle);
            for (var i = 0; i < 2; i++)
            {
                using var client = await TestSockets.ConnectAsync(address);
                var connection = await transport.AcceptAsync(listener);
                await connection.AssertEchoOnceAsync(client);
            }

            await transport.StopAsync();

            // Still open, and still the same socket: the owner's own accept takes the next connection.
            Assert.Equal(address, socket.LocalEndPoint);
        }

        using var last = await TestSockets.ConnectAsync(address);
        socket.Listen(); // only the Socket object's own flag: the kernel socket listens already
        using var accepted = await socket.AcceptAsync().WaitAsync(TestTimeouts.Default);
        Assert.Equal(last.LocalEndPoint, accepted.RemoteEndPoint);
    }

    /// <summary>
    /// A loop that cannot poll its listening socket fails the bind, instead of leaving its share of the connections
    /// with nobody to accept them. One epoll instance cannot watch one socket twice (EEXIST), which the same handle
    /// bound twice makes happen; the first listener goes on serving. (io_uring accepts twice on one socket.)
    /// </summary>
    [Theory]
    [MemberData(nameof(Transports.LinuxOnly), MemberType = typeof(Transports))]
    public async Task A_listener_that_a_loop_cannot_poll_fails_its_bind_and_leaves_the_others_serving(TransportKind kind)
    {
        using var socket = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
        socket.Bind(s_loopback);
        var address = (IPEndPoint)socket.LocalEndPoint!;
        var handle = new FileHandleEndPoint((ulong)socket.Handle, FileHandleType.Tcp);

        await using var transport = TestTransport.Create(kind, output);
        var listener = await transport.BindAsync(handle);
        var error = await Assert.ThrowsAsync<SocketException>(() => transport.BindAsync(handle));
        Assert.Contains("could not poll the listening socket", error.Message, StringComparison.Ordinal);

        using var client = await TestSockets.ConnectAsync(address);
        var connection = await transport.AcceptAsync(listener);
        await connection.AssertEchoOnceAsync(client);
        await transport.StopAsync();
    }
}
