using System.Diagnostics;
using System.Net.Sockets;
using Kestrel.Transport.Linux.Reliability.Tests.Infrastructure;
using Microsoft.AspNetCore.Http;

namespace Kestrel.Transport.Linux.Reliability.Tests.Load;

/// <summary>Connection churn: hundreds of thousands of short connections leave nothing behind.</summary>
[Collection(QuietProcess.Name)]
public sealed class ChurnTests(ITestOutputHelper output)
{
    private const int Cycles = 200_000;
    private const int WarmUpCycles = 5_000;
    private const int Workers = 64;

    // Descriptors: exactly back (after a settle of at most this long, for closes still in flight).
    private static readonly TimeSpan s_settle = TimeSpan.FromSeconds(5);

    // RSS: the heap may keep some of what the churn made it commit.
    private const long RssMargin = 64 * ProcessMemory.MiB;

    // Inline scheduling is left out to keep the suite inside its CI budget (it took about 40 s more here).
    public static TheoryData<TransportKind> Kinds => ReliabilityTransports.Default;

    /// <summary>
    /// Proves that 200,000 connect, request, close cycles on two loops are all served, half closed by the
    /// server (Connection: close) and half by the client, and that afterwards the process holds exactly the
    /// descriptors it held before, no thread the runtime's pools do not account for, RSS within 64 MiB of
    /// before, and (TestHost.StopAsync) no pool block.
    /// </summary>
    [Theory]
    [MemberData(nameof(Kinds))]
    public async Task Two_hundred_thousand_connect_request_close_cycles_leave_descriptors_threads_and_memory_as_they_were(TransportKind kind)
    {
        await using var host = await TestHost.StartAsync(
            kind,
            output,
            context =>
            {
                var body = "cycle " + context.Request.Path.Value![1..];
                context.Response.ContentLength = body.Length;
                return context.Response.WriteAsync(body);
            },
            s => s.Linux = o =>
            {
                o.ThreadCount = 2;
                // Adaptive: a loop taken from a thread stuck in a continuation (a lock whose holder waits for the
                // CPU, under this load) goes to a standby thread, which retires after this long unused.
                o.Tuning.StandbyRetireMilliseconds = 200;
            });

        // The first thousands of cycles pay for what the runtime, Kestrel and the thread pool set up once.
        await RunCyclesAsync(host, WarmUpCycles);
        var descriptorsBefore = ProcessResources.OpenFileDescriptors();
        var threadsBefore = ProcessResources.Threads();
        var loopThreadsBefore = LoopThreads(threadsBefore);
        var rssBefore = ProcessMemory.SettledRss();

        var stopwatch = Stopwatch.StartNew();
        await RunCyclesAsync(host, Cycles);
        var elapsed = stopwatch.Elapsed;

        var leaked = ProcessResources.NewDescriptorsExceptRuntimeImages(descriptorsBefore);
        var settle = Stopwatch.StartNew();
        while (leaked.Count > 0 && settle.Elapsed < s_settle)
        {
            await Task.Delay(100);
            leaked = ProcessResources.NewDescriptorsExceptRuntimeImages(descriptorsBefore);
        }

        // Loop threads may have changed places (Adaptive): their number is back once the standbys retire.
        var threadsAfter = ProcessResources.Threads();
        while ((LoopThreads(threadsAfter) != loopThreadsBefore) && settle.Elapsed < s_settle)
        {
            await Task.Delay(100);
            threadsAfter = ProcessResources.Threads();
        }

        var newThreads = ProcessResources.NewThreads(threadsBefore, threadsAfter).Where(t => !t.EndsWith($"'{LoopThreadName}'", StringComparison.Ordinal)).ToList();
        var loopThreadsAfter = LoopThreads(threadsAfter);
        var rssAfter = ProcessMemory.SettledRss();
        Figures.Report(output, "Churn", kind, $"{Cycles} connect-request-close cycles in {elapsed.TotalSeconds:F1} s ({Cycles / elapsed.TotalSeconds:F0}/s, {Workers} client tasks, 2 loops/IO queues); descriptors {descriptorsBefore.Count} before, {ProcessResources.OpenFileDescriptors().Count} after ({leaked.Count} new other than assembly and symbol files, settled in {settle.Elapsed.TotalSeconds:F1} s); threads {threadsBefore.Count} before, {ProcessResources.ThreadCount()} after ({newThreads.Count} not from the runtime's pools; loop threads {loopThreadsBefore} before, {loopThreadsAfter} after); RSS {rssBefore / ProcessMemory.MiB} MiB before, {rssAfter / ProcessMemory.MiB} MiB after");

        Assert.True(leaked.Count == 0, $"{leaked.Count} descriptor(s) opened during the churn are still open {s_settle.TotalSeconds} s after it ended (must be exactly back to the {descriptorsBefore.Count} before):{Environment.NewLine}{string.Join(Environment.NewLine, leaked.Take(20))}");
        Assert.True(loopThreadsAfter == loopThreadsBefore, $"{loopThreadsBefore} loop threads before the churn, {loopThreadsAfter} {s_settle.TotalSeconds} s after it (standbys retire after 200 ms).");
        Assert.True(newThreads.Count == 0, $"Threads started during the churn that are not the runtime's pool threads (the pools may grow and shrink; nothing else may appear): {string.Join(", ", newThreads)}");
        Assert.True(rssAfter <= rssBefore + RssMargin, $"RSS grew from {rssBefore / ProcessMemory.MiB} MiB to {rssAfter / ProcessMemory.MiB} MiB over the churn; the margin is {RssMargin / ProcessMemory.MiB} MiB.");
        await host.StopAsync();
    }

    // A loop thread's name ("Kestrel Linux loop N") as /proc shows it: cut to 15 characters.
    private const string LoopThreadName = "Kestrel Linux l";

    private static int LoopThreads(Dictionary<int, string> threads) => threads.Values.Count(name => name == LoopThreadName);

    private static async Task RunCyclesAsync(TestHost host, int cycles)
    {
        var next = 0;
        var failures = 0;
        var firstFailure = default(Exception);
        await Task.WhenAll(Enumerable.Range(0, Workers).Select(_ => Task.Run(async () =>
        {
            int cycle;
            while ((cycle = Interlocked.Increment(ref next)) <= cycles)
            {
                try
                {
                    await OneCycleAsync(host, cycle);
                }
                catch (Exception e) when (e is SocketException or IOException or TimeoutException or InvalidDataException or Xunit.Sdk.XunitException)
                {
                    if (Interlocked.Increment(ref failures) == 1)
                    {
                        firstFailure = e;
                    }
                }
            }
        })));

        Assert.True(failures == 0, $"{failures} of {cycles} cycles failed; the first: {firstFailure}");
    }

    private static async Task OneCycleAsync(TestHost host, int cycle)
    {
        var serverCloses = cycle % 2 == 0;
        using var client = await LeanConnection.ConnectAsync(host.EndPoint);
        await client.SendAsync(RawHttpRequest.Bytes("GET", $"/{cycle}", serverCloses ? "Connection: close\r\n" : null), TestTimeouts.Large);
        var (status, body) = await client.ReadStatusAndBodyAsync(TestTimeouts.Default);
        Assert.Equal(200, status);
        Assert.Equal($"cycle {cycle}", body);
        if (serverCloses)
        {
            // The server's FIN follows the response.
            Assert.Equal(0, await client.Socket.ReceiveAsync(new byte[1], TestTimeouts.Default));
        }
    }
}
