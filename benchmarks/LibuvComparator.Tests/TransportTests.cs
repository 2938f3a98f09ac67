using System.Net;
using System.Net.Sockets;
using LibuvComparator.Internal;
using Microsoft.AspNetCore.Connections;
using Microsoft.Extensions.Logging.Abstractions;
using Microsoft.Extensions.Options;

namespace LibuvComparator.Tests;

/// <summary>The transport on its own: Kestrel's contract exercised over real loopback sockets.</summary>
public sealed class TransportTests : IAsyncLifetime, IDisposable
{
    private static readonly TimeSpan s_timeout = TimeSpan.FromSeconds(30);

    private readonly LibuvTransportFactory _factory = new(
        Options.Create(new LibuvComparatorOptions { ThreadCount = 2 }), NullLoggerFactory.Instance);

    public Task InitializeAsync() => Task.CompletedTask;

    public async Task DisposeAsync() => await _factory.DisposeAsync();

    public void Dispose() => _factory.Dispose();

    [Fact]
    public void LibuvVersion_reports_the_loaded_library()
        => Assert.Matches(@"^1\.\d+\.\d+", LibuvComparatorOptions.LibuvVersion);

    [Fact]
    public async Task Binding_port_0_reports_the_real_port_and_accepts_on_it()
    {
        await using var listener = await _factory.BindAsync(new IPEndPoint(IPAddress.Loopback, 0));
        var endPoint = Assert.IsType<IPEndPoint>(listener.EndPoint);
        Assert.NotEqual(0, endPoint.Port);

        using var client = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
        await client.ConnectAsync(endPoint);
        await using var connection = await listener.AcceptAsync().AsTask().WaitAsync(s_timeout);
        Assert.NotNull(connection);
        Assert.Equal(client.LocalEndPoint, connection.RemoteEndPoint);
        Assert.Equal(client.RemoteEndPoint, connection.LocalEndPoint);
    }

    [Fact]
    public async Task IPv6_any_is_dual_mode_and_reports_IPv4_peers_as_mapped_addresses()
    {
        if (!Socket.OSSupportsIPv6)
        {
            return;
        }

        await using var listener = await _factory.BindAsync(new IPEndPoint(IPAddress.IPv6Any, 0));
        int port = ((IPEndPoint)listener.EndPoint).Port;
        using var client = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
        await client.ConnectAsync(new IPEndPoint(IPAddress.Loopback, port));
        await using var connection = (await listener.AcceptAsync().AsTask().WaitAsync(s_timeout))!;
        var remote = Assert.IsType<IPEndPoint>(connection.RemoteEndPoint);
        Assert.Equal(IPAddress.Loopback.MapToIPv6(), remote.Address);
        Assert.Equal(((IPEndPoint)client.LocalEndPoint!).Port, remote.Port);
    }

    [Fact]
    public async Task Binding_a_port_in_use_throws_AddressInUseException()
    {
        using var holder = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
        holder.Bind(new IPEndPoint(IPAddress.Loopback, 0));
        holder.Listen();

        await Assert.ThrowsAsync<AddressInUseException>(async () => await _factory.BindAsync(holder.LocalEndPoint!));
    }

    [Fact]
    public async Task Echo_returns_every_byte_in_order_and_FIN_ends_the_input()
    {
        await using var listener = await _factory.BindAsync(new IPEndPoint(IPAddress.Loopback, 0));
        var echo = EchoOneAsync(listener);

        // 4 MiB: more than MaxReadBufferSize/MaxWriteBufferSize in flight, so both directions hit backpressure.
        byte[] sent = new byte[4 * 1024 * 1024];
        new Random(42).NextBytes(sent);
        using var client = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
        await client.ConnectAsync(listener.EndPoint);
        var sending = Task.Run(async () =>
        {
            await client.SendAsync(sent);
            client.Shutdown(SocketShutdown.Send);
        });

        byte[] received = await ReceiveToEndAsync(client).WaitAsync(s_timeout);
        await sending;
        await echo.WaitAsync(s_timeout);
        Assert.Equal(sent.Length, received.Length);
        Assert.True(sent.AsSpan().SequenceEqual(received));
    }

    [Fact]
    public async Task Echo_serves_many_connections_across_the_loops()
    {
        await using var listener = await _factory.BindAsync(new IPEndPoint(IPAddress.Loopback, 0));
        var server = Task.Run(async () =>
        {
            var echoes = new List<Task>();
            for (int i = 0; i < 32; i++)
            {
                echoes.Add(EchoOneAsync(listener));
            }

            await Task.WhenAll(echoes);
        });

        await Task.WhenAll(Enumerable.Range(0, 32).Select(async i =>
        {
            using var client = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
            await client.ConnectAsync(listener.EndPoint);
            byte[] message = System.Text.Encoding.ASCII.GetBytes($"hello from client {i}");
            await client.SendAsync(message);
            client.Shutdown(SocketShutdown.Send);
            Assert.Equal(message, await ReceiveToEndAsync(client));
        })).WaitAsync(s_timeout);
        await server.WaitAsync(s_timeout);
    }

    [Fact]
    public async Task Abort_sends_RST_and_completes_input_with_the_reason()
    {
        await using var listener = await _factory.BindAsync(new IPEndPoint(IPAddress.Loopback, 0));
        using var client = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
        await client.ConnectAsync(listener.EndPoint);
        var connection = (await listener.AcceptAsync().AsTask().WaitAsync(s_timeout))!;

        var reading = connection.Transport.Input.ReadAsync().AsTask();
        var reason = new ConnectionAbortedException("test abort");
        connection.Abort(reason);

        var thrown = await Assert.ThrowsAsync<ConnectionAbortedException>(() => reading.WaitAsync(s_timeout));
        Assert.Same(reason, thrown);
        var reset = await Assert.ThrowsAsync<SocketException>(async () => await client.ReceiveAsync(new byte[16]).WaitAsync(s_timeout));
        Assert.Equal(SocketError.ConnectionReset, reset.SocketErrorCode);
        await connection.DisposeAsync().AsTask().WaitAsync(s_timeout);
    }

    [Fact]
    public async Task Peer_reset_completes_input_with_ConnectionResetException()
    {
        await using var listener = await _factory.BindAsync(new IPEndPoint(IPAddress.Loopback, 0));
        var client = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
        await client.ConnectAsync(listener.EndPoint);
        await using var connection = (await listener.AcceptAsync().AsTask().WaitAsync(s_timeout))!;

        client.LingerState = new LingerOption(true, 0);
        client.Dispose();

        await Assert.ThrowsAsync<ConnectionResetException>(async () =>
        {
            while (true)
            {
                var result = await connection.Transport.Input.ReadAsync().AsTask().WaitAsync(s_timeout);
                connection.Transport.Input.AdvanceTo(result.Buffer.End);
                if (result.IsCompleted)
                {
                    return;
                }
            }
        });
    }

    [Fact]
    public async Task Unbind_makes_AcceptAsync_return_null_and_frees_the_port()
    {
        var listener = await _factory.BindAsync(new IPEndPoint(IPAddress.Loopback, 0));
        var endPoint = (IPEndPoint)listener.EndPoint;
        var accept = listener.AcceptAsync().AsTask();

        await listener.UnbindAsync();
        Assert.Null(await accept.WaitAsync(s_timeout));
        await listener.DisposeAsync();

        using var rebind = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
        rebind.Bind(endPoint);
    }

    [Fact]
    public async Task Disposing_the_factory_resets_open_connections_and_ends_the_loop_threads()
    {
        var listener = await _factory.BindAsync(new IPEndPoint(IPAddress.Loopback, 0));
        using var client = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
        await client.ConnectAsync(listener.EndPoint);
        var connection = (await listener.AcceptAsync().AsTask().WaitAsync(s_timeout))!;
        var reading = connection.Transport.Input.ReadAsync().AsTask();
        var threads = _factory.Loops.Select(static l => l.Thread).ToArray();
        Assert.Equal(2, threads.Length);

        await _factory.DisposeAsync().AsTask().WaitAsync(s_timeout);

        Assert.All(threads, static t => Assert.False(t.IsAlive));
        await Assert.ThrowsAsync<ConnectionAbortedException>(() => reading.WaitAsync(s_timeout));
        await connection.DisposeAsync().AsTask().WaitAsync(s_timeout);
        await listener.DisposeAsync().AsTask().WaitAsync(s_timeout);
    }

    private static async Task EchoOneAsync(IConnectionListener listener)
    {
        var connection = (await listener.AcceptAsync())!;
        try
        {
            await connection.Transport.Input.CopyToAsync(connection.Transport.Output);
            await connection.Transport.Output.CompleteAsync();
        }
        finally
        {
            await connection.DisposeAsync();
        }
    }

    private static async Task<byte[]> ReceiveToEndAsync(Socket socket)
    {
        using var received = new MemoryStream();
        byte[] buffer = new byte[64 * 1024];
        int n;
        while ((n = await socket.ReceiveAsync(buffer)) > 0)
        {
            received.Write(buffer, 0, n);
        }

        return received.ToArray();
    }
}
