using System.IO.Pipelines;
using System.Net;
using System.Net.Sockets;
using Kestrel.Transport.Linux.Tests.Infrastructure;

namespace Kestrel.Transport.Linux.Tests.Transport;

/// <summary>Backpressure and load: the transport reads no faster than the app, and holds up under many connections.</summary>
public sealed class FlowControlTests(ITestOutputHelper output)
{
    private static readonly IPEndPoint s_loopback = new(IPAddress.Loopback, 0);

    [Theory]
    [MemberData(nameof(Transports.ConnectionLevel), MemberType = typeof(Transports))]
    public async Task A_server_that_does_not_read_stops_the_client_near_MaxReadBufferSize_and_then_gets_every_byte(TransportKind kind)
    {
        const long maxReadBufferSize = 64 * 1024;
        const int total = 64 * 1024 * 1024;
        const ulong seed = 64;

        // What may legitimately sit between the client and the app when the app reads nothing: the client's send
        // buffer, the server's receive buffer (the kernel does not grow it while nobody reads) and the transport's
        // MaxReadBufferSize plus one read's overshoot. Measured on loopback (kernel 6.18): 349 KiB, for Sockets and
        // for the Linux transport alike. A transport that keeps reading regardless would take all 64 MiB.
        const long stallBound = 2 * 1024 * 1024;

        await using var transport = TestTransport.Create(kind, output, s => s.MaxReadBufferSize = maxReadBufferSize);
        var listener = await transport.BindAsync(s_loopback);
        using var client = await TestSockets.ConnectAsync(listener.EndPoint);
        client.SendBufferSize = 64 * 1024;
        var connection = await transport.AcceptAsync(listener);

        client.Blocking = false;
        var chunk = new byte[64 * 1024];
        long sent = 0;
        var stalled = false;
        while (sent < total && !stalled && sent <= stallBound)
        {
            var size = (int)Math.Min(chunk.Length, total - sent);
            TestData.Fill(seed, sent, chunk.AsSpan(0, size));
            var offset = 0;
            while (offset < size)
            {
                var n = client.Send(chunk, offset, size - offset, SocketFlags.None, out var error);
                if (error == SocketError.WouldBlock)
                {
                    // Stalled means: not writable for a whole observation period.
                    if (!client.Poll(TestTimeouts.StallObservation, SelectMode.SelectWrite))
                    {
                        stalled = true;
                        break;
                    }

                    continue;
                }

                Assert.Equal(SocketError.Success, error);
                offset += n;
                sent += n;
            }
        }

        output.WriteLine($"The client stalled after {sent} bytes (bound {stallBound}).");
        Assert.True(stalled, $"The client was never blocked: {sent} bytes were taken while the app read nothing (MaxReadBufferSize {maxReadBufferSize}).");
        Assert.True(sent <= stallBound, $"The transport buffered too much: the client sent {sent} bytes before it stalled (bound {stallBound}).");

        // Now the app reads, and everything, including what waited in the client, must arrive intact.
        var read = connection.ReadToEndHashedAsync(TestTimeouts.Large);
        client.Blocking = true;
        for (var position = sent; position < total; position += chunk.Length)
        {
            var size = (int)Math.Min(chunk.Length, total - position);
            TestData.Fill(seed, position, chunk.AsSpan(0, size));
            await client.SendAllAsync(chunk.AsMemory(0, size), TestTimeouts.Large);
        }

        client.Shutdown(SocketShutdown.Send);
        var (length, sha256) = await read;
        Assert.Equal(total, length);
        Assert.Equal(TestData.Sha256(seed, total), sha256);
        await transport.StopAsync();
    }

    [Theory]
    [MemberData(nameof(Transports.ConnectionLevel), MemberType = typeof(Transports))]
    public async Task A_client_that_does_not_read_makes_FlushAsync_wait_near_MaxWriteBufferSize_and_then_gets_every_byte(TransportKind kind)
    {
        const long maxWriteBufferSize = 64 * 1024;
        const int total = 64 * 1024 * 1024;
        const ulong seed = 65;

        // The mirror of the read side: the server's send buffer and the client's receive buffer, which the
        // kernel does not grow while the client reads nothing, plus MaxWriteBufferSize. The kernel's send buffer
        // autotuning (tcp_wmem max 4 MiB) is the loose part: measured on loopback (kernel 6.18), 3.8 MiB for Sockets
        // and for the Linux transport alike. A transport whose flushes never wait would take all 64 MiB.
        const long stallBound = 8 * 1024 * 1024;

        await using var transport = TestTransport.Create(kind, output, s => s.MaxWriteBufferSize = maxWriteBufferSize);
        var listener = await transport.BindAsync(s_loopback);
        using var client = await TestSockets.ConnectAsync(listener.EndPoint);
        client.ReceiveBufferSize = 64 * 1024;
        var connection = await transport.AcceptAsync(listener);
        var writer = connection.Transport.Output;

        long written = 0;
        Task<FlushResult> flush = Task.FromResult(default(FlushResult));
        var stalled = false;
        while (written < total && written <= stallBound)
        {
            var span = writer.GetSpan();
            var size = (int)Math.Min(span.Length, total - written);
            TestData.Fill(seed, written, span[..size]);
            writer.Advance(size);
            written += size;
            flush = writer.FlushAsync().AsTask();

            // Stalled means: the flush stays pending for a whole observation period.
            if (await Task.WhenAny(flush, Task.Delay(TestTimeouts.StallObservation)) != flush)
            {
                stalled = true;
                break;
            }

            await flush;
        }

        output.WriteLine($"FlushAsync stalled after {written} bytes (bound {stallBound}).");
        Assert.True(stalled, $"FlushAsync never waited: {written} bytes were taken while the client read nothing (MaxWriteBufferSize {maxWriteBufferSize}).");
        Assert.True(written <= stallBound, $"The transport buffered too much: {written} bytes were flushed before a flush waited (bound {stallBound}).");

        // Now the client reads, the pending flush completes, and everything arrives intact.
        var receive = client.ReceiveToEndHashedAsync(TestTimeouts.Large);
        await flush.WaitAsync(TestTimeouts.Default);
        while (written < total)
        {
            var span = writer.GetSpan();
            var size = (int)Math.Min(span.Length, total - written);
            TestData.Fill(seed, written, span[..size]);
            writer.Advance(size);
            written += size;
            await writer.FlushAsync().AsTask().WaitAsync(TestTimeouts.Default);
        }

        await writer.CompleteAsync();
        var (length, sha256) = await receive;
        Assert.Equal(total, length);
        Assert.Equal(TestData.Sha256(seed, total), sha256);
        await transport.StopAsync();
    }

    [Theory]
    [MemberData(nameof(Transports.ConnectionLevel), MemberType = typeof(Transports))]
    public async Task A_storm_of_500_concurrent_connects_is_accepted_and_echoed(TransportKind kind)
    {
        const int clients = 500;
        await using var transport = TestTransport.Create(kind, output);
        var listener = await transport.BindAsync(s_loopback);

        var echoes = new List<Task>();
        var accepting = Task.Run(async () =>
        {
            for (var i = 0; i < clients; i++)
            {
                var connection = await transport.AcceptAsync(listener, TestTimeouts.Large);
                echoes.Add(connection.EchoAsync(TestTimeouts.Large));
            }
        });

        var exchanges = Enumerable.Range(0, clients).Select(async i =>
        {
            using var client = await TestSockets.ConnectAsync(listener.EndPoint, TestTimeouts.Large);
            var message = BitConverter.GetBytes((long)i);
            await client.SendAllAsync(message, TestTimeouts.Large);
            var reply = new byte[message.Length];
            await client.ReceiveExactlyAsync(reply, TestTimeouts.Large);
            Assert.Equal(message, reply);
            client.Shutdown(SocketShutdown.Send);
            Assert.Empty(await client.ReceiveToEndAsync(TestTimeouts.Large));
        }).ToArray();

        await Task.WhenAll(exchanges).WaitAsync(TestTimeouts.Large);
        await accepting.WaitAsync(TestTimeouts.Large);
        await Task.WhenAll(echoes).WaitAsync(TestTimeouts.Large);
        Assert.Equal(clients, echoes.Count);
        await transport.StopAsync();
    }
}
