using System.Net;
using System.Net.Sockets;
using System.Runtime.InteropServices;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.AspNetCore.Connections;
using Microsoft.AspNetCore.Connections.Features;

namespace Kestrel.Transport.Linux.Tests.Transport;

/// <summary>
/// IConnectionSocketFeature: the connection's socket as a <see cref="Socket"/>, for its options (keep-alive, TCP_INFO,
/// peer credentials). The options are read back with libc's getsockopt on the fd, not through the Socket itself.
/// </summary>
public sealed partial class SocketFeatureTests(ITestOutputHelper output)
{
    private const int SOL_SOCKET = 1;
    private const int SO_KEEPALIVE = 9;
    private const int SO_PEERCRED = 17;
    private const int IPPROTO_TCP = 6;
    private const int TCP_INFO = 11;
    private const byte TCP_ESTABLISHED = 1;

    private static readonly IPEndPoint s_loopback = new(IPAddress.Loopback, 0);

    [Theory]
    [MemberData(nameof(Transports.ConnectionLevel), MemberType = typeof(Transports))]
    public async Task The_socket_sets_and_reads_the_connection_s_options_and_names_its_endpoints(TransportKind kind)
    {
        await using var transport = TestTransport.Create(kind, output);
        var listener = await transport.BindAsync(s_loopback);
        using var client = await TestSockets.ConnectAsync(listener.EndPoint);
        var connection = await transport.AcceptAsync(listener);

        var socket = SocketOf(connection);
        Assert.Equal(client.LocalEndPoint, socket.RemoteEndPoint);
        Assert.Equal(client.RemoteEndPoint, socket.LocalEndPoint);

        Assert.Equal(0, GetIntOption(socket, SOL_SOCKET, SO_KEEPALIVE));
        socket.SetSocketOption(SocketOptionLevel.Socket, SocketOptionName.KeepAlive, true);
        Assert.Equal(1, GetIntOption(socket, SOL_SOCKET, SO_KEEPALIVE));

        // struct tcp_info starts with tcpi_state (tcp(7)).
        var info = new byte[104];
        Assert.True(socket.GetRawSocketOption(IPPROTO_TCP, TCP_INFO, info) > 0);
        Assert.Equal(TCP_ESTABLISHED, info[0]);

        await connection.AssertEchoOnceAsync(client);
        await transport.StopAsync();
    }

    /// <summary>The peer's pid, uid and gid of a Unix socket connection (SO_PEERCRED, unix(7)): this process, the client.</summary>
    [Theory]
    [MemberData(nameof(Transports.ConnectionLevel), MemberType = typeof(Transports))]
    public Task On_a_Unix_socket_it_reads_the_peer_s_credentials(TransportKind kind) => WithSocketPathAsync(async path =>
    {
        await using var transport = TestTransport.Create(kind, output);
        var listener = await transport.BindAsync(new UnixDomainSocketEndPoint(path));
        using var client = await TestSockets.ConnectAsync(listener.EndPoint);
        var connection = await transport.AcceptAsync(listener);

        var credentials = new byte[12]; // struct ucred: pid, uid, gid
        Assert.Equal(12, SocketOf(connection).GetRawSocketOption(SOL_SOCKET, SO_PEERCRED, credentials));
        Assert.Equal(Environment.ProcessId, BitConverter.ToInt32(credentials, 0));

        await connection.AssertEchoOnceAsync(client);
        await transport.StopAsync();
    });

    /// <summary>
    /// Unlike the Sockets transport's, this Socket does not own the connection: disposing it closes nothing, and the
    /// connection goes on. Nor does it delete a Unix socket's file, which is the listener's.
    /// </summary>
    [Theory]
    [MemberData(nameof(Transports.LinuxOnly), MemberType = typeof(Transports))]
    public Task Disposing_the_socket_leaves_the_connection_and_the_socket_file_alone(TransportKind kind) => WithSocketPathAsync(async path =>
    {
        await using var transport = TestTransport.Create(kind, output);
        foreach (EndPoint endPoint in new EndPoint[] { s_loopback, new UnixDomainSocketEndPoint(path) })
        {
            var listener = await transport.BindAsync(endPoint);
            using var client = await TestSockets.ConnectAsync(listener.EndPoint);
            var connection = await transport.AcceptAsync(listener);
            int fd = checked((int)SocketOf(connection).Handle);

            SocketOf(connection).Dispose();

            Assert.True(fcntl(fd, 1 /* F_GETFD */) >= 0, $"fd {fd} was closed with the Socket ({endPoint}).");
            for (int round = 0; round < 3; round++)
            {
                await connection.AssertEchoOnceAsync(client);
            }
        }

        Assert.True(File.Exists(path), "Disposing the Socket of a Unix socket connection deleted the listener's socket file.");
        await transport.StopAsync();
    });

    /// <summary>Once the connection has closed, the Socket throws instead of reaching an fd number the kernel may have reused.</summary>
    [Theory]
    [MemberData(nameof(Transports.ConnectionLevel), MemberType = typeof(Transports))]
    public async Task After_the_connection_closed_the_socket_is_disposed(TransportKind kind)
    {
        await using var transport = TestTransport.Create(kind, output);
        var listener = await transport.BindAsync(s_loopback);
        using var client = await TestSockets.ConnectAsync(listener.EndPoint);
        var connection = await transport.AcceptAsync(listener);
        var socket = SocketOf(connection);
        await connection.AssertEchoOnceAsync(client);

        var closed = connection.WaitForConnectionClosedAsync();
        client.Shutdown(SocketShutdown.Send);
        await transport.DisposeConnectionAsync(connection);
        await closed;

        // Disposed before the fd was closed, so before ConnectionClosed: never a window in which it would reach a closed
        // descriptor (EBADF) or a number the kernel has given to another socket.
        Assert.Throws<ObjectDisposedException>(() => socket.Available);
        Assert.Throws<ObjectDisposedException>(() => socket.GetSocketOption(SocketOptionLevel.Socket, SocketOptionName.KeepAlive));
        await transport.StopAsync();
    }

    private static Socket SocketOf(ConnectionContext connection) =>
        Assert.IsAssignableFrom<IConnectionSocketFeature>(connection.Features.Get<IConnectionSocketFeature>()).Socket;

    /// <summary>Runs <paramref name="test"/> with the path of a Unix socket in a directory of its own, removed afterwards.</summary>
    private static async Task WithSocketPathAsync(Func<string, Task> test)
    {
        var directory = Directory.CreateTempSubdirectory("ktl-feature-");
        try
        {
            await test(Path.Combine(directory.FullName, "feature.sock"));
        }
        finally
        {
            directory.Delete(recursive: true);
        }
    }

    /// <summary>getsockopt(2) on the Socket's fd through libc, so the check does not rest on the Socket's own reading.</summary>
    private static unsafe int GetIntOption(Socket socket, int level, int name)
    {
        int value = -1;
        int length = sizeof(int);
        Assert.Equal(0, getsockopt(checked((int)socket.Handle), level, name, &value, &length));
        return value;
    }

    [LibraryImport("libc", EntryPoint = "getsockopt", SetLastError = true)]
    private static unsafe partial int getsockopt(int fd, int level, int name, void* value, int* length);

    [LibraryImport("libc", EntryPoint = "fcntl", SetLastError = true)]
    private static partial int fcntl(int fd, int command);
}
