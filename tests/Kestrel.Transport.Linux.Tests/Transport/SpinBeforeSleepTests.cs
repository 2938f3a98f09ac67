using System.Buffers;
using System.Diagnostics;
using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Interop;
using Kestrel.Transport.Linux.Loop;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.Extensions.Logging.Abstractions;

namespace Kestrel.Transport.Linux.Tests.Transport;

/// <summary>
/// SpinBeforeSleepMicroseconds: a loop with nothing left to do keeps polling for the time given, then
/// sleeps. (Requests that arrive while it spins are served by every host-level test of the
/// LinuxInlineSpin kind.)
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

    /// <summary>Ten samples in a row, 1 ms apart: longer than a collection's pause, which also blocks the thread.</summary>
    private static bool WaitUntilBlocked(EventLoop loop, TimeSpan timeout) => LoopThread.WaitUntilAsleep(loop, timeout, samplesInARow: 10);
}
