using System.Collections.Concurrent;
using System.Diagnostics;
using System.Globalization;
using Kestrel.Transport.Linux.Reliability.Tests.Infrastructure;
using Microsoft.AspNetCore.Http;

namespace Kestrel.Transport.Linux.Reliability.Tests.Load;

/// <summary>Ten thousand keep-alive connections held open at once, every one served twice, and what an idle one costs.</summary>
[Collection(QuietProcess.Name)]
public sealed class HeldConnectionsTests(ITestOutputHelper output)
{
    private const int Connections = 10_000;

    // The server's 10,000 sockets plus what the test process already holds; the clients' 10,000 are in the python child.
    private const int DescriptorsNeeded = Connections + 1_000;

    // Generous: Kestrel's per-connection objects are a few KiB; an idle connection must not hold a pool block
    // (4 KiB) or a read buffer per socket. A leak of even one 64 KiB buffer per connection fails it.
    private const long MaxBytesPerIdleConnection = 64 * 1024;

    private const string Script = """
        import resource, socket, sys
        port, count = int(sys.argv[1]), int(sys.argv[2])
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        socks = []
        for i in range(count):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            socks.append(s)
        print("connected %d" % len(socks), flush=True)

        for line in sys.stdin:
            command = line.split()
            if command[0] == "round":
                r = command[1]
                for i, s in enumerate(socks):
                    s.sendall(("GET /held/%d/%s HTTP/1.1\r\nHost: localhost\r\n\r\n" % (i, r)).encode())
                ok, errors = 0, []
                for i, s in enumerate(socks):
                    try:
                        status, body = read_response(s)
                        if status == 200 and body == ("c%d r%s" % (i, r)).encode():
                            ok += 1
                        elif len(errors) < 5:
                            errors.append("connection %d: %d %r" % (i, status, body))
                    except Exception as e:
                        if len(errors) < 5:
                            errors.append("connection %d: %r" % (i, e))
                print("round %s ok %d errors: %s" % (r, ok, "; ".join(errors) or "none"), flush=True)
            elif command[0] == "close":
                for s in socks:
                    s.close()
                print("closed", flush=True)
                break
        """;

    public static TheoryData<TransportKind> Kinds => ReliabilityTransports.Scheduling;

    /// <summary>
    /// Proves that 10,000 concurrent keep-alive connections are all accepted and served, that all of them
    /// stay open (the second request of each arrives on the connection that carried its first), and that an
    /// idle connection costs the server less than 64 KiB of resident memory; the figure is reported beside Sockets'.
    /// </summary>
    [FileDescriptorTheory(DescriptorsNeeded)]
    [MemberData(nameof(Kinds))]
    public async Task Ten_thousand_keep_alive_connections_are_all_served_twice_on_the_same_connection_and_idle_cheaply(TransportKind kind)
    {
        FileDescriptorLimit.RaiseSoftTo(DescriptorsNeeded);
        var firstConnection = new ConcurrentDictionary<int, string>();
        var secondOnSameConnection = 0;
        var secondOnOtherConnection = 0;
        await using var host = await TestHost.StartAsync(kind, output, async context =>
        {
            var parts = context.Request.Path.Value!.Split('/');
            var index = int.Parse(parts[2], CultureInfo.InvariantCulture);
            var round = parts[3];
            if (round == "1")
            {
                firstConnection[index] = context.Connection.Id;
            }
            else if (firstConnection.TryGetValue(index, out var id) && id == context.Connection.Id)
            {
                Interlocked.Increment(ref secondOnSameConnection);
            }
            else
            {
                Interlocked.Increment(ref secondOnOtherConnection);
            }

            var body = $"c{index} r{round}";
            context.Response.ContentLength = body.Length;
            await context.Response.WriteAsync(body);
        });

        // Warm the request path, so that JIT and first-use allocations are not counted per connection.
        using (var warm = new HttpClient())
        {
            for (var i = 0; i < 20; i++)
            {
                (await warm.GetAsync(new Uri(host.Address, $"/held/{i}/1"))).EnsureSuccessStatusCode();
            }
        }

        firstConnection.Clear();
        var rssBefore = ProcessMemory.SettledRss();
        var managedBefore = ProcessMemory.LiveManagedBytes();
        var stopwatch = Stopwatch.StartNew();
        await using var client = PythonClient.Start(Script, host.Address.Port.ToString(CultureInfo.InvariantCulture), Connections.ToString(CultureInfo.InvariantCulture));
        Assert.Equal($"connected {Connections}", await client.ReadLineAsync(TestTimeouts.Large));
        var connectTime = stopwatch.Elapsed;

        Assert.Equal($"round 1 ok {Connections} errors: none", await client.CommandAsync("round 1", TestTimeouts.Large));
        var firstRoundTime = stopwatch.Elapsed - connectTime;
        Assert.Equal(Connections, firstConnection.Count);
        Assert.Equal(Connections, firstConnection.Values.Distinct().Count());

        // Every connection is open and idle now.
        var rssIdle = ProcessMemory.SettledRss();
        var managedIdle = ProcessMemory.LiveManagedBytes();
        var blocksIdle = host.MemoryPool.OutstandingCount;
        var bytesPerConnection = (rssIdle - rssBefore) / Connections;
        var managedPerConnection = (managedIdle - managedBefore) / Connections;
        Figures.Report(output, "Idle keep-alive connections", kind, $"{Connections} held; per idle connection {managedPerConnection / 1024.0:F1} KiB of live managed heap, {bytesPerConnection / 1024.0:F1} KiB of RSS (RSS {rssBefore / ProcessMemory.MiB} -> {rssIdle / ProcessMemory.MiB} MiB; RSS depends on what earlier tests left committed, the live heap does not); {blocksIdle} pool blocks out while idle; connect {connectTime.TotalSeconds:F1} s, first round {firstRoundTime.TotalSeconds:F1} s");

        var secondRoundStart = stopwatch.Elapsed;
        Assert.Equal($"round 2 ok {Connections} errors: none", await client.CommandAsync("round 2", TestTimeouts.Large));
        output.WriteLine($"Second round: {(stopwatch.Elapsed - secondRoundStart).TotalSeconds:F1} s");
        Assert.True(
            secondOnSameConnection == Connections,
            $"Every second request must arrive on the connection of its first (keep-alive held): {secondOnSameConnection} did, {secondOnOtherConnection} arrived on another connection.");

        Assert.True(
            bytesPerConnection < MaxBytesPerIdleConnection,
            $"An idle connection costs {bytesPerConnection} bytes of RSS (bound {MaxBytesPerIdleConnection}): RSS went from {rssBefore} to {rssIdle} for {Connections} connections.");
        Assert.True(
            managedPerConnection < MaxBytesPerIdleConnection,
            $"An idle connection holds {managedPerConnection} bytes of live managed objects (bound {MaxBytesPerIdleConnection}): the live heap went from {managedBefore} to {managedIdle} for {Connections} connections.");
        Assert.True(blocksIdle < Connections / 10, $"{blocksIdle} pool blocks are out with {Connections} idle connections: an idle connection must not hold a buffer.");

        Assert.Equal("closed", await client.CommandAsync("close", TestTimeouts.Large));
        await host.StopAsync();
    }
}
