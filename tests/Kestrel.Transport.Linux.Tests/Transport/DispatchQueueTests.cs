using System.Buffers;
using System.Diagnostics;
using Kestrel.Transport.Linux.Interop;
using Kestrel.Transport.Linux.Internal;
using Microsoft.Extensions.Logging.Abstractions;

namespace Kestrel.Transport.Linux.Tests.Transport;

/// <summary>
/// The loop and its thread-pool dispatch queue must never leave each other waiting: a continuation
/// that blocks on its pool thread until its loop has run something (synchronous body I/O under
/// backpressure does exactly that) has to be released however the two threads interleave. Each case
/// lets the loop fall asleep first, which is the interleaving that once hung the synchronous I/O test
/// about one run in five.
/// </summary>
public sealed class DispatchQueueTests : IDisposable
{
    private const int Rounds = 20;
    private static readonly TimeSpan Release = TimeSpan.FromSeconds(5);

    private readonly TransportMetrics _metrics = new(meterFactory: null);
    private readonly EventLoop _loop;

    public DispatchQueueTests()
    {
        _loop = new EventLoop(0, new LinuxTransportOptions { ThreadCount = 1 }, MemoryPool<byte>.Shared, NullLogger.Instance, _metrics);
        _loop.Start();
    }

    public void Dispose()
    {
        _loop.Stop(abortConnections: true);
        _loop.Join();
        _metrics.Dispose();
    }

    [Fact]
    public void A_batch_queued_by_the_loop_that_waits_for_the_loop_is_released()
    {
        for (int round = 0; round < Rounds; round++)
        {
            using var ran = new ManualResetEventSlim();
            bool released = false;
            using var done = new ManualResetEventSlim();
            _loop.Post(_ => _loop.ApplicationScheduler.Schedule(_ =>
            {
                // The loop queued this batch and went on to sleep; post to it only once it sleeps.
                WaitUntilLoopSleeps();
                _loop.Post(_ => ran.Set(), null);
                released = ran.Wait(Release);
                done.Set();
            }, null), null);

            Assert.True(done.Wait(Release * 2), $"round {round}: the batch never finished");
            Assert.True(released, $"round {round}: the loop slept through work posted by its own dispatch batch");
        }
    }

    [Fact]
    public void A_batch_queued_from_another_thread_that_waits_for_the_loop_is_released()
    {
        for (int round = 0; round < Rounds; round++)
        {
            WaitUntilLoopSleeps();
            using var ran = new ManualResetEventSlim();
            bool released = false;
            using var done = new ManualResetEventSlim();
            _loop.ApplicationScheduler.Schedule(_ =>
            {
                _loop.Post(_ => ran.Set(), null);
                released = ran.Wait(Release);
                done.Set();
            }, null);

            Assert.True(done.Wait(Release * 2), $"round {round}: the batch never finished");
            Assert.True(released, $"round {round}: the loop slept through work posted by a batch it had not queued");
        }
    }

    [Fact]
    public void A_continuation_queued_from_another_thread_behind_a_blocked_one_gets_run()
    {
        for (int round = 0; round < Rounds; round++)
        {
            WaitUntilLoopSleeps();
            using var blocked = new ManualResetEventSlim();
            using var behind = new ManualResetEventSlim();
            bool released = false;
            using var done = new ManualResetEventSlim();
            _loop.ApplicationScheduler.Schedule(_ =>
            {
                blocked.Set();
                released = behind.Wait(Release);
                done.Set();
            }, null);

            // Queued behind the blocked continuation, in the same batch, by a thread that is neither
            // the loop nor the batch: only the loop's stall check can start a second drainer.
            Assert.True(blocked.Wait(Release), $"round {round}: the first continuation never ran");
            _loop.ApplicationScheduler.Schedule(_ => behind.Set(), null);

            Assert.True(done.Wait(Release * 2), $"round {round}: the first continuation never finished");
            Assert.True(released, $"round {round}: the continuation queued behind a blocked one never ran");
        }
    }

    /// <summary>Waits until the loop thread is asleep in epoll_wait (nothing else runs on it here).</summary>
    private void WaitUntilLoopSleeps()
    {
        var stat = $"/proc/self/task/{WaitForThreadId()}/stat";
        var deadline = Stopwatch.StartNew();
        int asleep = 0;
        while (asleep < 3)
        {
            Assert.True(deadline.Elapsed < Release, "the loop thread never went to sleep");
            asleep = Affinity.IsThreadBlocked(stat) ? asleep + 1 : 0;
            Thread.Sleep(1);
        }
    }

    private int WaitForThreadId()
    {
        var deadline = Stopwatch.StartNew();
        while (_loop.ThreadId == 0)
        {
            Assert.True(deadline.Elapsed < Release, "the loop thread never started");
            Thread.Sleep(1);
        }

        return _loop.ThreadId;
    }
}
