using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.AspNetCore.Http;
using Microsoft.Extensions.Logging;

namespace Kestrel.Transport.Linux.Tests.Hosting;

/// <summary>
/// What an operator sees of Adaptive scheduling (issue 38): a handler that blocks its loop is named in a warning
/// (event 22) as soon as the loop is taken from it, not only once it returns; hand-offs are counted with their reason
/// and endpoint, and refused hand-offs, demotions, connections that start on the pool, loop threads and standbys
/// have instruments of their own; and first-use work (the JIT) on a cold start is no warning.
/// </summary>
[Collection(QuietProcess.Name)]
public sealed class AdaptiveObservabilityTests(ITestOutputHelper output)
{
    private const string Handoffs = "kestrel.transport.linux.loop.handoffs";

    /// <summary>
    /// A handler that blocks until the test releases it: while it still blocks, warning 22 names its connection (whose
    /// id Kestrel's TraceIdentifier of each HTTP/1.1 request begins with), the hand-off is counted as "blocked" on the
    /// server's address and port, the connection's demotion is counted, and the loop threads' gauge shows the thread
    /// that blocks and the one that holds the loop now.
    /// </summary>
    [Theory]
    [MemberData(nameof(AdaptiveTesting.Kinds), MemberType = typeof(AdaptiveTesting))]
    public async Task A_blocking_handler_is_named_while_it_blocks_and_its_hand_off_is_counted_with_reason_and_endpoint(TransportKind kind)
    {
        var log = new TransportLogLines();
        using var release = new ManualResetEventSlim();
        var blocking = new TaskCompletionSource<(string TraceIdentifier, string ConnectionId)>(TaskCreationOptions.RunContinuationsAsynchronously);
        await using var host = await AdaptiveTesting.StartAsync(
            kind,
            output,
            async context =>
            {
                if (context.Request.Path == "/block")
                {
                    blocking.TrySetResult((context.TraceIdentifier, context.Connection.Id));
                    release.Wait(TestTimeouts.Large);
                }

                await context.Response.WriteAsync("ok");
            },
            settings: s => s.Builder = b => b.Logging.AddProvider(log));

        using var meter = new TaggedMeasurements(host);
        var connection = (await AdaptiveTesting.WarmedAsync(host, 1))[0];
        try
        {
            var blocked = AdaptiveTesting.GetAsync(connection, "/block", TestTimeouts.Default);
            var (traceIdentifier, connectionId) = await blocking.Task.WaitAsync(TestTimeouts.Default);
            Assert.StartsWith(connectionId, traceIdentifier, StringComparison.Ordinal);

            await AdaptiveTesting.WaitUntilAsync(() => log.With(22, LogLevel.Warning).Count > 0, TimeSpan.FromSeconds(10), "warning 22 while the handler blocks");
            string warning = Assert.Single(log.With(22, LogLevel.Warning));
            output.WriteLine(warning);
            Assert.Contains(connectionId, warning, StringComparison.Ordinal);
            Assert.Contains("TraceIdentifier", warning, StringComparison.Ordinal);

            meter.Collect();
            output.WriteLine($"hand-offs: {meter.Describe(Handoffs)}; threads: {meter.Describe("kestrel.transport.linux.loop.threads")}; standbys: {meter.Describe("kestrel.transport.linux.loop.standbys")}");
            Assert.Equal(1, meter.Sum(Handoffs, "kestrel.transport.linux.handoff.reason=blocked", "server.address=127.0.0.1", $"server.port={host.Address.Port}", "kestrel.transport.linux.loop=0"));
            Assert.Equal(1, meter.Sum("kestrel.transport.linux.connection.demotions", "kestrel.transport.linux.handoff.reason=blocked"));
            Assert.True(meter.Max("kestrel.transport.linux.loop.threads") >= 2, "the loop threads' gauge does not show both threads");
            Assert.NotEmpty(meter.Of("kestrel.transport.linux.loop.standbys"));

            release.Set();
            Assert.Equal("ok", await blocked);
            Assert.Single(log.With(22, LogLevel.Warning)); // once, at the take
        }
        finally
        {
            release.Set();
            connection.Dispose();
        }

        await host.StopAsync();
    }

    /// <summary>
    /// A loop taken eight times within a second starts its new connections on the pool for a while: each such
    /// connection is counted. Eight warmed connections block 300 ms each, one every 40 ms (apart enough that they are
    /// handed off one by one, not spilled as a storm, and all within a second), then a new connection makes a request.
    /// </summary>
    [Theory]
    [MemberData(nameof(AdaptiveTesting.Kinds), MemberType = typeof(AdaptiveTesting))]
    public async Task New_connections_that_start_on_the_pool_are_counted(TransportKind kind)
    {
        await using var host = await AdaptiveTesting.StartAsync(kind, output, async context =>
        {
            if (context.Request.Path == "/block")
            {
                Thread.Sleep(300);
            }

            await context.Response.WriteAsync("ok");
        });

        using var meter = new TaggedMeasurements(host);
        var connections = await AdaptiveTesting.WarmedAsync(host, 8);
        try
        {
            await Task.Delay(1100); // a take of the warm-up's (the JIT's, in a cold process) is out of the second counted
            var blocks = new List<Task<string>>();
            foreach (var c in connections)
            {
                blocks.Add(AdaptiveTesting.GetAsync(c, "/block", TestTimeouts.Default));
                await Task.Delay(40);
            }

            await Task.WhenAll(blocks);
            meter.Collect();
            Assert.True(meter.Sum(Handoffs) >= 8, $"only {meter.Sum(Handoffs)} hand-offs: the case needs eight within a second");
            using var newcomer = await RawHttpConnection.ConnectAsync(host.EndPoint, CancellationToken.None);
            Assert.Equal("ok", await AdaptiveTesting.GetAsync(newcomer, "/new", TestTimeouts.Default));
            meter.Collect();
            Assert.Equal(1, meter.Sum("kestrel.transport.linux.connections.started_on_pool", "kestrel.transport.linux.loop=0"));
        }
        finally
        {
            connections.ForEach(c => c.Dispose());
        }

        await host.StopAsync();
    }

    /// <summary>
    /// At the thread limit (LoopThreadLimit and LoopThreadCeiling 1: no thread but the loop's own) a block cannot be
    /// handed off: the refusal is counted as "thread_limit" and logged, and the handler's request is answered once it
    /// returns.
    /// </summary>
    [Theory]
    [MemberData(nameof(AdaptiveTesting.Kinds), MemberType = typeof(AdaptiveTesting))]
    public async Task A_hand_off_refused_at_the_thread_limit_is_counted(TransportKind kind)
    {
        var log = new TransportLogLines();
        await using var host = await AdaptiveTesting.StartAsync(
            kind,
            output,
            async context =>
            {
                if (context.Request.Path == "/block")
                {
                    Thread.Sleep(300);
                }

                await context.Response.WriteAsync("ok");
            },
            o =>
            {
                o.Tuning.LoopThreadLimit = 1;
                o.Tuning.LoopThreadCeiling = 1;
            },
            s => s.Builder = b => b.Logging.AddProvider(log));

        using var meter = new TaggedMeasurements(host);
        var connection = (await AdaptiveTesting.WarmedAsync(host, 1))[0];
        try
        {
            Assert.Equal("ok", await AdaptiveTesting.GetAsync(connection, "/block", TestTimeouts.Default));
            meter.Collect();
            output.WriteLine($"refused: {meter.Describe("kestrel.transport.linux.loop.handoffs.refused")}");
            Assert.True(meter.Sum("kestrel.transport.linux.loop.handoffs.refused", "error.type=thread_limit", "kestrel.transport.linux.loop=0") >= 1);
            Assert.Equal(0, meter.Sum(Handoffs));
            Assert.NotEmpty(log.With(23, LogLevel.Warning));
        }
        finally
        {
            connection.Dispose();
        }

        await host.StopAsync();
    }
}
