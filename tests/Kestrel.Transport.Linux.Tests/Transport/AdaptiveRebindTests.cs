using System.Diagnostics;
using System.Net;
using Kestrel.Transport.Linux.Hosting;
using Kestrel.Transport.Linux.Loop;
using Kestrel.Transport.Linux.Tests.Hosting;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.AspNetCore.Connections;

namespace Kestrel.Transport.Linux.Tests.Transport;

/// <summary>
/// Binding again after the last listener was disposed starts a new loop group (issue 38): the old group's monitor
/// thread and its standbys, which on io_uring never retire on their own, must end with it. Threads are counted by
/// name in /proc/self/task, so this runs alone (<see cref="QuietProcess"/>).
/// </summary>
[Collection(QuietProcess.Name)]
public sealed class AdaptiveRebindTests(ITestOutputHelper output)
{
    private const int Cycles = 50;
    private const string MonitorComm = "Kestrel Linux m"; // "Kestrel Linux monitor", cut at 15 bytes
    private const string LoopComm = "Kestrel Linux l";

    /// <summary>
    /// Fifty times: bind, hand the loop off once (a read continuation that sleeps on the loop's thread, so a standby is
    /// left), dispose the listener. Then one more bind: one monitor thread and one loop thread more than before the
    /// cycles, and no thread of the fifty groups left.
    /// </summary>
    [Theory]
    [MemberData(nameof(AdaptiveTesting.Kinds), MemberType = typeof(AdaptiveTesting))]
    public async Task Binding_and_disposing_a_listener_50_times_leaves_one_monitor_and_no_standby(TransportKind kind)
    {
        await using var transport = TestTransport.Create(kind, output, s => s.ThreadCount = 1);
        var factory = Assert.IsType<LinuxTransportFactory>(transport.Factory);
        int monitorsBefore = AdaptiveTesting.ThreadsNamed(MonitorComm);
        int loopThreadsBefore = AdaptiveTesting.ThreadsNamed(LoopComm);
        var groups = new List<(LoopThreads Threads, int MonitorThread)>();

        for (int i = 0; i < Cycles; i++)
        {
            var listener = await transport.BindAsync(new IPEndPoint(IPAddress.Loopback, 0));
            var monitor = factory.Loops[0].Continuations!.Monitor;
            await AdaptiveTesting.WaitUntilAsync(() => monitor.ThreadId != 0, TestTimeouts.Default, "the monitor to start");
            groups.Add((factory.LoopThreads!, monitor.ThreadId));

            using (var client = await TestSockets.ConnectAsync(listener.EndPoint))
            {
                var connection = await transport.AcceptAsync(listener);
                var reading = BlockOnTheLoopAsync(connection, factory.Loops[0]);
                await client.SendAllAsync(new byte[1]);
                Assert.Equal(factory.Loops[0].ThreadName, await reading.WaitAsync(TestTimeouts.Default));
                await transport.DisposeConnectionAsync(connection);
            }

            await AdaptiveTesting.WaitUntilAsync(() => groups[^1].Threads.Waiting > 0, TestTimeouts.Default, "the thread the loop was taken from to wait as a standby");
            await listener.UnbindAsync();
            await listener.DisposeAsync();
        }

        // The counts before may include threads of an earlier test's group that were still on their way out, so the
        // end state is stated whole: this transport's one group, with its one monitor and its one loop thread, and
        // nothing else of that name in the process (this collection runs alone).
        await transport.BindAsync(new IPEndPoint(IPAddress.Loopback, 0));
        var waited = Stopwatch.StartNew();
        while (waited.Elapsed < TestTimeouts.ThreadExit
            && (groups.Any(g => g.Threads.Count > 0 || AdaptiveTesting.ThreadAlive(g.MonitorThread))
                || AdaptiveTesting.ThreadsNamed(MonitorComm) != 1 || AdaptiveTesting.ThreadsNamed(LoopComm) != 1))
        {
            await Task.Delay(50);
        }

        int monitors = AdaptiveTesting.ThreadsNamed(MonitorComm);
        int loopThreads = AdaptiveTesting.ThreadsNamed(LoopComm);
        int groupsWithThreads = groups.Count(g => g.Threads.Count > 0);
        int monitorsAlive = groups.Count(g => AdaptiveTesting.ThreadAlive(g.MonitorThread));
        output.WriteLine($"{kind}: monitor threads {monitorsBefore} before, {monitors} after {Cycles} cycles and one more bind; loop threads {loopThreadsBefore} before, {loopThreads} after; {groupsWithThreads} old groups with threads, {monitorsAlive} old monitors alive");
        Assert.Equal(0, monitorsAlive);
        Assert.Equal(0, groupsWithThreads);
        Assert.Equal(1, monitors);
        Assert.Equal(1, loopThreads);
        await transport.StopAsync();
    }

    /// <summary>
    /// Reads once, and sleeps on the thread the read resumed on (the loop's, with Adaptive scheduling) until the loop has
    /// been taken from it: that thread's name.
    /// </summary>
    private static async Task<string?> BlockOnTheLoopAsync(ConnectionContext connection, EventLoop loop)
    {
        var result = await connection.Transport.Input.ReadAsync();
        string? thread = Thread.CurrentThread.Name;
        var waited = Stopwatch.StartNew();
        while (loop.IsLoopThread && waited.Elapsed < TestTimeouts.Default)
        {
            Thread.Sleep(5);
        }

        connection.Transport.Input.AdvanceTo(result.Buffer.End);
        return thread;
    }
}
