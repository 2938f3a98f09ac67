using System.Buffers;
using System.Diagnostics;
using System.Runtime.CompilerServices;
using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Interop;
using Kestrel.Transport.Linux.Loop;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.Extensions.Logging.Abstractions;

namespace Kestrel.Transport.Linux.Tests.Transport;

/// <summary>
/// SpinBeforeSleepMicroseconds: a loop with nothing left to do keeps polling for the time given, then
/// sleeps. (Requests that arrive while it spins are served by every host-level test of the
/// LinuxInlineSpin kind.) And the internal IdlePoll, which polls only where it measured that polling pays.
/// </summary>
public sealed class SpinBeforeSleepTests
{
    private static readonly TimeSpan Timeout = TimeSpan.FromSeconds(10);

    [Fact]
    public void An_idle_loop_spins_for_the_time_given_and_then_sleeps()
    {
        const int SpinMicroseconds = 500_000;
        using var metrics = new TransportMetrics(meterFactory: null);
        var loop = new EventLoop(0, new LinuxTransportOptions { ThreadCount = 1, ApplicationSchedulingMode = ApplicationSchedulingMode.Inline, SpinBeforeSleepMicroseconds = SpinMicroseconds }, IoBackend.Epoll, MemoryPool<byte>.Shared, NullLogger.Instance, metrics);
        loop.Start();
        try
        {
            // The loop's first sleep comes after a spin too: let it settle, then give it work.
            Assert.True(WaitUntilBlocked(loop, Timeout), "the loop never went to sleep after its first spin");
            var ran = new ManualResetEventSlim();
            var clock = Stopwatch.StartNew();
            loop.Post(static s => ((ManualResetEventSlim)s!).Set(), ran);
            Assert.True(ran.Wait(Timeout), "the posted work never ran");

            // Half a second of spinning: the thread is running (or runnable) in that time, not asleep. A
            // garbage collection elsewhere in the test host can stop it for a moment, so only a thread
            // seen blocked four times in a row, 5 ms apart, counts as asleep.
            var stat = $"/proc/self/task/{loop.ThreadId}/stat";
            bool sleptEarly = false;
            int blockedInARow = 0;
            while (clock.Elapsed < TimeSpan.FromMilliseconds(200))
            {
                blockedInARow = Affinity.IsThreadBlocked(stat) ? blockedInARow + 1 : 0;
                sleptEarly |= blockedInARow >= 4;
                Thread.Sleep(5);
            }

            Assert.False(sleptEarly, "the loop slept within 200 ms of its last work, though it was to spin for 500 ms");
            Assert.True(WaitUntilBlocked(loop, Timeout), "the loop never went to sleep after spinning");
            Assert.True(clock.Elapsed >= TimeSpan.FromMilliseconds(400), $"the loop slept after {clock.Elapsed.TotalMilliseconds:F0} ms; it was to spin for 500 ms");
        }
        finally
        {
            loop.Stop(abortConnections: true);
            loop.Join();
        }
    }

    /// <summary>
    /// The internal IdlePoll (off by default, IdlePollMaxMicroseconds): with its cap set, a loop fed a second of work in
    /// bursts runs through epochs that poll and epochs that sleep (it alternates while it has measured neither), runs every
    /// item posted meanwhile (work posted during a poll is found, not left for the next wake-up), and once the work stops it
    /// sleeps: an idle loop never polls.
    /// </summary>
    [Fact]
    public void With_the_idle_poll_on_every_posted_item_runs_and_an_idle_loop_sleeps()
    {
        using var metrics = new TransportMetrics(meterFactory: null);
        var options = new LinuxTransportOptions { ThreadCount = 1, ApplicationSchedulingMode = ApplicationSchedulingMode.Inline };
        options.Tuning.IdlePollMaxMicroseconds = 50;
        var loop = new EventLoop(0, options, IoBackend.Epoll, MemoryPool<byte>.Shared, NullLogger.Instance, metrics);
        loop.Start();
        try
        {
            const int Items = 20_000;
            var counter = new StrongBox<int>();
            var clock = Stopwatch.StartNew();
            for (int i = 0; i < Items; i++)
            {
                loop.Post(static s => Interlocked.Increment(ref ((StrongBox<int>)s!).Value), counter);

                // Gaps of 0-80 µs between posts: some inside the poll's window, some past it.
                long until = Stopwatch.GetTimestamp() + (Stopwatch.Frequency * (i % 5) * 20 / 1_000_000);
                while (Stopwatch.GetTimestamp() < until)
                {
                    Thread.SpinWait(10);
                }
            }

            Assert.True(SpinWait.SpinUntil(() => Volatile.Read(ref counter.Value) == Items, Timeout),
                $"{Volatile.Read(ref counter.Value)} of {Items} posted items ran within {Timeout.TotalSeconds:F0} s");
            Assert.True(WaitUntilBlocked(loop, Timeout), $"the loop never went to sleep after the work stopped ({clock.Elapsed.TotalMilliseconds:F0} ms)");
        }
        finally
        {
            loop.Stop(abortConnections: true);
            loop.Join();
        }
    }

    /// <summary>Ten samples in a row, 1 ms apart: longer than a collection's pause, which also blocks the thread.</summary>
    private static bool WaitUntilBlocked(EventLoop loop, TimeSpan timeout) => LoopThread.WaitUntilAsleep(loop, timeout, samplesInARow: 10);
}
