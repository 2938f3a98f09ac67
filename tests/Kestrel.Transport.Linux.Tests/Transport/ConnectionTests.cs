using System.Net;
using System.Net.Sockets;
using System.Text;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.AspNetCore.Connections;

namespace Kestrel.Transport.Linux.Tests.Transport;

/// <summary>One connection's life over real loopback sockets: data, and each way it can end.</summary>
public sealed class ConnectionTests(ITestOutputHelper output)
{
    private static readonly IPEndPoint s_loopback = new(IPAddress.Loopback, 0);

    [Theory]
    [MemberData(nameof(Transports.ConnectionLevel), MemberType = typeof(Transports))]
    public async Task Echo_returns_what_the_client_sent_and_reports_both_endpoints(TransportKind kind)
    {
        await using var transport = TestTransport.Create(kind, output);
        var listener = await transport.BindAsync(s_loopback);
        using var client = await TestSockets.ConnectAsync(listener.EndPoint);
        var connection = await transport.AcceptAsync(listener);

        Assert.Equal(client.LocalEndPoint, connection.RemoteEndPoint);
        Assert.Equal(client.RemoteEndPoint, connection.LocalEndPoint);
        Assert.False(string.IsNullOrEmpty(connection.ConnectionId));

        var echo = connection.EchoAsync(TestTimeouts.Default);
        for (var round = 0; round < 10; round++)
        {
            var message = TestData.Create(seed: (ulong)round, length: 1 + (round * 1000));
            await client.SendAllAsync(message);
            var reply = new byte[message.Length];
            await client.ReceiveExactlyAsync(reply);
            Assert.Equal(message, reply);
        }

        client.Shutdown(SocketShutdown.Send);
        Assert.Empty(await client.ReceiveToEndAsync());
        await echo.WaitAsync(TestTimeouts.Default);

        await transport.StopAsync();
    }

    /// <summary>
    /// Ids count on from the clock (UTC ticks) at the process's first connection, as the Sockets transport's do, not from
    /// 1: a restarted server, or a second replica, does not repeat another's ids in logs and trace identifiers.
    /// </summary>
    [Theory]
    [MemberData(nameof(Transports.LinuxOnly), MemberType = typeof(Transports))]
    public async Task Connection_ids_count_on_from_the_clock_so_a_restart_does_not_repeat_them(TransportKind kind)
    {
        long processStarted = System.Diagnostics.Process.GetCurrentProcess().StartTime.ToUniversalTime().Ticks;
        await using var transport = TestTransport.Create(kind, output);
        var listener = await transport.BindAsync(s_loopback);
        var ids = new List<long>();
        for (var i = 0; i < 3; i++)
        {
            using var client = await TestSockets.ConnectAsync(listener.EndPoint);
            var id = (await transport.AcceptAsync(listener)).ConnectionId;
            Assert.Matches("^L[0-9A-F]{16}$", id);
            ids.Add(long.Parse(id.AsSpan(1), System.Globalization.NumberStyles.HexNumber, System.Globalization.CultureInfo.InvariantCulture));
        }

        long now = DateTime.UtcNow.Ticks;
        Assert.All(ids, id => Assert.InRange(id, processStarted, now));
        Assert.True(ids[0] < ids[1] && ids[1] < ids[2], $"Ids do not increase: {string.Join(", ", ids)}");
        await transport.StopAsync(expectRentals: false);
    }

    [Theory]
    [MemberData(nameof(Transports.ConnectionLevel), MemberType = typeof(Transports))]
    public async Task Abort_sends_RST_and_faults_input_with_the_reason(TransportKind kind)
    {
        await using var transport = TestTransport.Create(kind, output);
        var listener = await transport.BindAsync(s_loopback);
        using var client = await TestSockets.ConnectAsync(listener.EndPoint);
        var connection = await transport.AcceptAsync(listener);

        // Traffic first, so the connection is known to be fully set up on both loops.
        await client.SendAllAsync("ping"u8.ToArray());
        Assert.Equal("ping"u8.ToArray(), await connection.ReadExactlyAsync(4));

        var closed = connection.WaitForConnectionClosedAsync();
        var pendingRead = connection.Transport.Input.ReadAsync().AsTask();
        var reason = new ConnectionAbortedException("aborted by the test");
        connection.Abort(reason);

        var fault = await Assert.ThrowsAnyAsync<Exception>(() => pendingRead.WaitAsync(TestTimeouts.Default));
        Assert.Same(reason, fault);

        var reset = await Assert.ThrowsAsync<SocketException>(() => client.ReceiveAsync(new byte[16], TestTimeouts.Default));
        Assert.Equal(SocketError.ConnectionReset, reset.SocketErrorCode);

        await closed;
        await transport.StopAsync();
    }

    [Theory]
    [MemberData(nameof(Transports.ConnectionLevel), MemberType = typeof(Transports))]
    public async Task Completing_output_sends_every_byte_then_FIN(TransportKind kind)
    {
        const int length = 8 * 1024 * 1024; // far more than the socket buffers, so completion must wait for deferred sends
        await using var transport = TestTransport.Create(kind, output);
        var listener = await transport.BindAsync(s_loopback);
        using var client = await TestSockets.ConnectAsync(listener.EndPoint);
        var connection = await transport.AcceptAsync(listener);

        var receive = client.ReceiveToEndHashedAsync(TestTimeouts.Large);
        var writer = connection.Transport.Output;
        var position = 0;
        while (position < length)
        {
            // Fill whatever block the pipe offers, as Kestrel does, flushing every ~100 KB.
            var flushAt = Math.Min(position + 100_000, length);
            while (position < flushAt)
            {
                var span = writer.GetSpan();
                var size = Math.Min(span.Length, flushAt - position);
                TestData.Fill(seed: 7, position, span[..size]);
                writer.Advance(size);
                position += size;
            }

            await writer.FlushAsync().AsTask().WaitAsync(TestTimeouts.Default);
        }

        await writer.CompleteAsync();

        // A receive returning 0 after all the bytes is the FIN; a RST would have thrown.
        var (received, sha256) = await receive;
        Assert.Equal(length, received);
        Assert.Equal(TestData.Sha256(seed: 7, length), sha256);
        await transport.StopAsync();
    }

    [Theory]
    [MemberData(nameof(Transports.ConnectionLevel), MemberType = typeof(Transports))]
    public async Task Client_RST_faults_input_with_ConnectionResetException_and_fires_ConnectionClosed(TransportKind kind)
    {
        await using var transport = TestTransport.Create(kind, output);
        var listener = await transport.BindAsync(s_loopback);
        var client = await TestSockets.ConnectAsync(listener.EndPoint);
        var connection = await transport.AcceptAsync(listener);
        var closed = connection.WaitForConnectionClosedAsync();

        await client.SendAllAsync("hello"u8.ToArray());
        Assert.Equal("hello"u8.ToArray(), await connection.ReadExactlyAsync(5));

        client.LingerState = new LingerOption(true, 0); // close(2) now sends RST instead of FIN
        client.Dispose();

        var fault = await connection.Transport.Input.ReadUntilFaultAsync();
        Assert.IsType<ConnectionResetException>(fault);
        await closed;
        await transport.StopAsync();
    }

    [Theory]
    [MemberData(nameof(Transports.ConnectionLevel), MemberType = typeof(Transports))]
    public async Task Client_FIN_completes_input_and_fires_ConnectionClosed_while_output_still_reaches_the_client(TransportKind kind)
    {
        await using var transport = TestTransport.Create(kind, output);
        var listener = await transport.BindAsync(s_loopback);
        using var client = await TestSockets.ConnectAsync(listener.EndPoint);
        var connection = await transport.AcceptAsync(listener);
        var closed = connection.WaitForConnectionClosedAsync();

        await client.SendAllAsync("last words"u8.ToArray());
        client.Shutdown(SocketShutdown.Send);

        var (length, sha256) = await connection.ReadToEndHashedAsync(TestTimeouts.Default);
        Assert.Equal(10, length);
        await closed;

        // A FIN closes only the client's half: what the server still writes must arrive, followed by its own FIN.
        await connection.Transport.Output.WriteAsync("goodbye"u8.ToArray()).AsTask().WaitAsync(TestTimeouts.Default);
        await connection.Transport.Output.CompleteAsync();
        Assert.Equal("goodbye", Encoding.ASCII.GetString(await client.ReceiveToEndAsync()));
        await transport.StopAsync();
    }

    [Theory]
    [MemberData(nameof(Transports.ConnectionLevel), MemberType = typeof(Transports))]
    public async Task Sixteen_megabytes_echo_intact_both_ways(TransportKind kind)
    {
        const int length = 16 * 1024 * 1024;
        const ulong seed = 16;
        await using var transport = TestTransport.Create(kind, output);
        var listener = await transport.BindAsync(s_loopback);
        using var client = await TestSockets.ConnectAsync(listener.EndPoint);
        var connection = await transport.AcceptAsync(listener);

        var echo = connection.EchoAsync(TestTimeouts.Large);
        var receive = client.ReceiveToEndHashedAsync(TestTimeouts.Large);
        var chunk = new byte[50_000]; // not a multiple of 4096, so segments straddle blocks
        for (var position = 0; position < length; position += chunk.Length)
        {
            var size = Math.Min(chunk.Length, length - position);
            TestData.Fill(seed, position, chunk.AsSpan(0, size));
            await client.SendAllAsync(chunk.AsMemory(0, size), TestTimeouts.Large);
        }

        client.Shutdown(SocketShutdown.Send);
        var expected = TestData.Sha256(seed, length);

        var (serverLength, serverSha256) = await echo.WaitAsync(TestTimeouts.Large);
        Assert.Equal(length, serverLength);
        Assert.Equal(expected, serverSha256);

        var (clientLength, clientSha256) = await receive;
        Assert.Equal(length, clientLength);
        Assert.Equal(expected, clientSha256);
        await transport.StopAsync();
    }
}
