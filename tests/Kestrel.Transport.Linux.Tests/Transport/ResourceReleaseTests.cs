using System.Diagnostics;
using System.Net;
using System.Net.Sockets;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.AspNetCore.Connections;

namespace Kestrel.Transport.Linux.Tests.Transport;

/// <summary>Nothing outlives the transport: no descriptor, no thread, no memory block.</summary>
[Collection(QuietProcess.Name)]
public sealed class ResourceReleaseTests(ITestOutputHelper output)
{
    private const int ConnectionsPerEnding = 4;

    [Theory]
    [MemberData(nameof(Transports.ConnectionLevel), MemberType = typeof(Transports))]
    public async Task Disposing_connections_listeners_and_factory_releases_every_descriptor_thread_and_block(TransportKind kind)
    {
        // One cycle first: the runtime opens some descriptors and starts its own socket engine lazily, once per process.
        await RunCycleAsync(kind, whileRunning: null);
        GC.Collect();
        GC.WaitForPendingFinalizers();
        GC.Collect();

        var descriptorsBefore = ProcessResources.OpenFileDescriptors();
        var threadsBefore = ProcessResources.Threads();
        var threadCountBefore = ProcessResources.ThreadCount();
        List<string> threadsWhileRunning = [];

        await RunCycleAsync(kind, whileRunning: () => threadsWhileRunning = ProcessResources.NewThreads(threadsBefore, ProcessResources.Threads()));

        output.WriteLine($"Threads started by the transport while it ran: {string.Join(", ", threadsWhileRunning)}");
        if (kind.IsLinux())
        {
            // Proves the thread check below can see the transport's threads at all.
            Assert.True(
                threadsWhileRunning.Count >= Transports.LinuxThreadCount,
                $"Expected at least {Transports.LinuxThreadCount} event-loop threads while running, saw: {string.Join(", ", threadsWhileRunning)}");
        }

        // Descriptors must be closed by the time DisposeAsync returns: no margin, because the warm-up cycle
        // already paid for everything the runtime opens once for this test. Assembly images are left out:
        // work another test left behind may still make the runtime load one meanwhile (seen once:
        // Microsoft.Win32.Registry.dll, opened twice during the LinuxAio cycle), and the transport opens none.
        var leaked = ProcessResources.NewDescriptorsExceptRuntimeImages(descriptorsBefore);
        Assert.True(leaked.Count == 0, $"{leaked.Count} descriptor(s) opened during the cycle are still open after disposal:{Environment.NewLine}{string.Join(Environment.NewLine, leaked)}");

        // Threads: compared by id rather than by the bare count, because the thread pool may add and retire
        // workers of its own at any time; its threads are recognised by name.
        var stopwatch = Stopwatch.StartNew();
        var lingering = ProcessResources.NewThreads(threadsBefore, ProcessResources.Threads());
        while (lingering.Count > 0 && stopwatch.Elapsed < TestTimeouts.ThreadExit)
        {
            await Task.Delay(50);
            lingering = ProcessResources.NewThreads(threadsBefore, ProcessResources.Threads());
        }

        output.WriteLine($"Threads: {threadCountBefore} before the cycle, {ProcessResources.ThreadCount()} after it (thread-pool workers included).");
        Assert.True(lingering.Count == 0, $"Thread(s) started during the cycle still run {TestTimeouts.ThreadExit.TotalSeconds} s after disposal: {string.Join(", ", lingering)}");
    }

    /// <summary>
    /// Clients keep connecting while the listener is unbound: every socket accepted up to then is served and
    /// closed, and none is left open by the unbinding (on io_uring, sockets the multishot accept took into
    /// completions that nobody will read are closed by the engine), so the descriptor count comes back exactly.
    /// </summary>
    [Theory]
    [MemberData(nameof(Transports.ConnectionLevel), MemberType = typeof(Transports))]
    public async Task Unbinding_while_clients_keep_connecting_leaves_no_descriptor_open(TransportKind kind)
    {
        await ConnectWhileUnbindingAsync(kind); // the runtime's own once-per-process descriptors
        GC.Collect();
        GC.WaitForPendingFinalizers();
        var descriptorsBefore = ProcessResources.OpenFileDescriptors();

        var (accepted, connected) = await ConnectWhileUnbindingAsync(kind);

        output.WriteLine($"{connected} clients connected, {accepted} connections accepted before the unbinding took effect.");
        Assert.True(accepted > 0, "No connection was accepted before the listener was unbound.");
        var leaked = ProcessResources.NewDescriptorsExceptRuntimeImages(descriptorsBefore);
        Assert.True(leaked.Count == 0, $"{leaked.Count} descriptor(s) still open after unbinding and disposal:{Environment.NewLine}{string.Join(Environment.NewLine, leaked)}");
    }

    /// <summary>
    /// A stop resets every connection of a loop in one pass. On io_uring the polls of all of them end in one removal
    /// (ktl_ring_remove_all) before their fds close: 1,100 connections are more than the ring's 1,024 submission
    /// entries (and their completions more than a quarter of its completion queue), so the submission queue fills and
    /// is flushed within the removal. Every client must see the reset, and every descriptor must be closed.
    /// </summary>
    [Theory]
    [InlineData(TransportKind.LinuxNative)]
    [InlineData(TransportKind.LinuxIoUring)]
    public async Task A_stop_resets_more_connections_in_one_pass_than_the_ring_has_entries_and_closes_every_descriptor(TransportKind kind)
    {
        const int Connections = 1100;
        var descriptorsBefore = ProcessResources.OpenFileDescriptors();
        var transport = TestTransport.Create(kind, output, s => s.ThreadCount = 1);
        var listener = await transport.BindAsync(new IPEndPoint(IPAddress.Loopback, 0));
        var clients = new List<Socket>();
        var connections = new List<ConnectionContext>();
        try
        {
            for (int i = 0; i < Connections; i++)
            {
                clients.Add(await TestSockets.ConnectAsync(listener.EndPoint));
                connections.Add(await listener.AcceptAsync().AsTask().WaitAsync(TestTimeouts.Default) ?? throw new InvalidOperationException("The listener ended."));
            }

            // Disposing the factory stops the loop at once: one pass resets all of its connections.
            await ((IAsyncDisposable)transport.Factory).DisposeAsync().AsTask().WaitAsync(TestTimeouts.Default);
            var endings = await Task.WhenAll(clients.Select(async client =>
            {
                try
                {
                    return await client.ReceiveAsync(new byte[1], TestTimeouts.Default) == 0 ? "end of stream" : "data";
                }
                catch (SocketException e)
                {
                    return e.SocketErrorCode.ToString();
                }
            }));
            var counts = endings.GroupBy(e => e).ToDictionary(g => g.Key, g => g.Count());
            output.WriteLine(string.Join(", ", counts.Select(c => $"{c.Value} {c.Key}")));
            Assert.Equal(Connections, counts.GetValueOrDefault(nameof(SocketError.ConnectionReset)));

            await Task.WhenAll(connections.Select(c => c.DisposeAsync().AsTask())).WaitAsync(TestTimeouts.Default);
            await listener.DisposeAsync();
        }
        finally
        {
            foreach (var client in clients)
            {
                client.Dispose();
            }

            await transport.DisposeAsync();
        }

        var leaked = ProcessResources.NewDescriptorsExceptRuntimeImages(descriptorsBefore);
        Assert.True(leaked.Count == 0, $"{leaked.Count} descriptor(s) still open after the stop:{Environment.NewLine}{string.Join(Environment.NewLine, leaked.Take(20))}");
        transport.MemoryPool.AssertAllReturned();
    }

    /// <summary>Far more connects than one unbinding takes, and far fewer sockets than the process may open.</summary>
    private const int MaxClientsWhileUnbinding = 5000;

    private async Task<(int Accepted, int Connected)> ConnectWhileUnbindingAsync(TransportKind kind)
    {
        await using var transport = TestTransport.Create(kind, output);
        var listener = await transport.BindAsync(new IPEndPoint(IPAddress.Loopback, 0));
        var endPoint = listener.EndPoint;
        int accepted = 0;
        var acceptLoop = Task.Run(async () =>
        {
            while (await listener.AcceptAsync() is { } connection)
            {
                accepted++;
                await connection.DisposeAsync();
            }
        });

        var clients = new List<Socket>();
        using var stop = new CancellationTokenSource();
        try
        {
            var connectLoop = Task.Run(async () =>
            {
                // Bounded: once connects are refused a loop that never waits would open sockets by the thousand per
                // millisecond, and on a slow machine run the process out of descriptors before the stop comes.
                while (!stop.IsCancellationRequested && clients.Count < MaxClientsWhileUnbinding)
                {
                    var client = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
                    lock (clients)
                    {
                        clients.Add(client);
                    }

                    try
                    {
                        await client.ConnectAsync(endPoint);
                    }
                    catch (SocketException)
                    {
                        // Refused once the listener is closed.
                        await Task.Delay(1);
                    }
                }
            });

            await Task.Delay(200);
            await listener.UnbindAsync().AsTask().WaitAsync(TestTimeouts.Default);
            await Task.Delay(50);
            await stop.CancelAsync();
            await connectLoop.WaitAsync(TestTimeouts.Default);
            await acceptLoop.WaitAsync(TestTimeouts.Default);
            await listener.DisposeAsync();
            await transport.StopAsync(expectRentals: false);
        }
        finally
        {
            await stop.CancelAsync();
            lock (clients)
            {
                foreach (var client in clients)
                {
                    client.Dispose();
                }
            }
        }

        return (accepted, clients.Count);
    }

    /// <summary>
    /// A TCP and a Unix-socket listener; connections that end in every way (client FIN, server abort,
    /// client RST, still open at disposal) after moving data; then Kestrel's shutdown order and the pool check.
    /// </summary>
    private async Task RunCycleAsync(TransportKind kind, Action? whileRunning)
    {
        var directory = Directory.CreateTempSubdirectory("ktl-fd-");
        try
        {
            await using var transport = TestTransport.Create(kind, output);
            var tcp = await transport.BindAsync(new IPEndPoint(IPAddress.Loopback, 0));
            var unix = await transport.BindAsync(new UnixDomainSocketEndPoint(Path.Combine(directory.FullName, "cycle.sock")));

            var clients = new List<Socket>();
            var connections = new List<ConnectionContext>();
            foreach (var listener in new[] { tcp, unix })
            {
                for (var i = 0; i < 4 * ConnectionsPerEnding; i++)
                {
                    var client = await TestSockets.ConnectAsync(listener.EndPoint);
                    clients.Add(client);
                    var connection = await transport.AcceptAsync(listener);
                    connections.Add(connection);
                    var message = TestData.Create((ulong)i, 10_000);
                    await client.SendAllAsync(message);
                    await connection.Transport.Output.WriteAsync(await connection.ReadExactlyAsync(message.Length));
                    await client.ReceiveExactlyAsync(new byte[message.Length]);
                }
            }

            whileRunning?.Invoke();

            var endings = new List<Task>();
            for (var i = 0; i < clients.Count; i++)
            {
                var client = clients[i];
                var connection = connections[i];
                switch (i % 4)
                {
                    case 0: // client FIN, server completes both pipes
                        client.Shutdown(SocketShutdown.Send);
                        endings.Add(EndGracefullyAsync(connection, client));
                        break;
                    case 1: // server abort
                        connection.Abort(new ConnectionAbortedException("cycle"));
                        endings.Add(connection.WaitForConnectionClosedAsync());
                        break;
                    case 2: // client RST
                        client.LingerState = new LingerOption(true, 0);
                        client.Dispose();
                        endings.Add(connection.WaitForConnectionClosedAsync());
                        break;
                    default: // left open: disposal must close it
                        break;
                }
            }

            await Task.WhenAll(endings).WaitAsync(TestTimeouts.Default);
            await transport.StopAsync();
            foreach (var client in clients)
            {
                client.Dispose();
            }
        }
        finally
        {
            directory.Delete(recursive: true);
        }
    }

    private static async Task EndGracefullyAsync(ConnectionContext connection, Socket client)
    {
        var (length, _) = await connection.ReadToEndHashedAsync(TestTimeouts.Default);
        Assert.Equal(0, length);
        await connection.Transport.Input.CompleteAsync();
        await connection.Transport.Output.CompleteAsync();
        Assert.Empty(await client.ReceiveToEndAsync());
    }
}
