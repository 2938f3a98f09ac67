using System.Buffers;
using System.Diagnostics;
using System.Runtime.CompilerServices;
using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Loop;
using Kestrel.Transport.Linux.Scheduling;
using Kestrel.Transport.Linux.Tests.Infrastructure;
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
        // The batch is ThreadPool scheduling's (Adaptive uses it for what leaves the loop too).
        _loop = new EventLoop(0, new LinuxTransportOptions { ThreadCount = 1, ApplicationSchedulingMode = ApplicationSchedulingMode.ThreadPool }, IoBackend.Epoll, MemoryPool<byte>.Shared, NullLogger.Instance, _metrics);
        _loop.Start();
    }

    public void Dispose()
    {
        _loop.Stop(abortConnections: true);
        _loop.Join();
        _metrics.Dispose();
    }

    /// <summary>
    /// A continuation scheduled from another thread just as the batch finishes its last one must run. The batch clears
    /// its scheduled flag and then looks at the queue once more; x64 may let that look pass the store that cleared the
    /// flag, so without a full fence between them the batch could see the queue empty while the producer still saw the
    /// flag set, and the continuation stayed queued with nothing scheduled to run it. Seen once in CI, on .NET 11: a
    /// read whose data was in the pipe, and whose cancellation had fired too, never completed (the dump showed one item
    /// in the queue with the flag clear). Each round here schedules the next continuation the moment the previous one
    /// has run, which is when the batch is ending. A lost continuation never runs, so the bound is the suite's 30 s rather
    /// than the class's 5 s: this class runs beside others that hold pool threads, and a batch the pool starts late is
    /// slow, not lost (the failure says which, from the pool's state).
    /// </summary>
    [Fact]
    public void Continuations_scheduled_from_another_thread_as_each_batch_ends_all_run()
    {
        const int Count = 200_000;
        var neverRan = TestTimeouts.Default;
        var queue = (ThreadPoolDispatchQueue)_loop.ApplicationScheduler;
        var ran = new StrongBox<int>();
        Action<object?> step = static state => Interlocked.Increment(ref ((StrongBox<int>)state!).Value);
        var clock = Stopwatch.StartNew();
        for (int i = 1; i <= Count; i++)
        {
            queue.Schedule(step, ran);
            long waitingSince = clock.ElapsedTicks;
            while (Volatile.Read(ref ran.Value) < i)
            {
                if (TimeSpan.FromTicks((clock.ElapsedTicks - waitingSince) * TimeSpan.TicksPerSecond / Stopwatch.Frequency) > neverRan)
                {
                    // Which side lost it: a batch still flagged as scheduled, with the pool holding work items, is the
                    // thread pool not running a queued item; no batch scheduled is this queue's own race.
                    Assert.Fail($"continuation {i} of {Count} never ran ({Volatile.Read(ref ran.Value)} ran); batch scheduled or running: " +
                                $"{queue.IsActive}; the thread pool: {ThreadPool.PendingWorkItemCount} work items pending, {ThreadPool.ThreadCount} threads, " +
                                $"{ThreadPool.CompletedWorkItemCount} completed");
                }

                Thread.SpinWait(1);
            }
        }
    }

    [Fact]
    public void A_batch_queued_by_the_loop_that_waits_for_the_loop_is_released()
    {
        for (int round = 0; round < Rounds; round++)
        {
            // The loop queues this batch and goes on to sleep; the batch posts to it only once it sleeps.
            var outcome = new Outcome();
            _loop.Post(_ => _loop.ApplicationScheduler.Schedule(WaitsForTheLoop(outcome, afterTheLoopSleeps: true), null), null);
            AssertReleased(outcome, round, "the loop slept through work posted by its own dispatch batch");
        }
    }

    [Fact]
    public void A_batch_queued_from_another_thread_that_waits_for_the_loop_is_released()
    {
        for (int round = 0; round < Rounds; round++)
        {
            Assert.True(LoopSleeps(), $"round {round}: the loop thread never went to sleep");
            var outcome = new Outcome();
            _loop.ApplicationScheduler.Schedule(WaitsForTheLoop(outcome, afterTheLoopSleeps: false), null);
            AssertReleased(outcome, round, "the loop slept through work posted by a batch it had not queued");
        }
    }

    [Fact]
    public void A_continuation_queued_from_another_thread_behind_a_blocked_one_gets_run()
    {
        for (int round = 0; round < Rounds; round++)
        {
            Assert.True(LoopSleeps(), $"round {round}: the loop thread never went to sleep");
            var blocked = new ManualResetEventSlim();
            var behind = new ManualResetEventSlim();
            var outcome = new Outcome();
            _loop.ApplicationScheduler.Schedule(_ =>
            {
                blocked.Set();
                outcome.Released = behind.Wait(Release);
                outcome.Done.Set();
            }, null);

            // Queued behind the blocked continuation, in the same batch, by a thread that is neither
            // the loop nor the batch: only the loop's stall check can start a second drainer.
            Assert.True(blocked.Wait(Release), $"round {round}: the first continuation never ran");
            _loop.ApplicationScheduler.Schedule(_ => behind.Set(), null);
            AssertReleased(outcome, round, "the continuation queued behind a blocked one never ran");
        }
    }

    [Fact]
    public void A_batch_that_stays_busy_hands_its_pool_thread_back_every_turn_and_runs_everything()
    {
        // 400 continuations of 250 µs each, every one queuing the next two ahead of time, so the queue
        // never empties for about 100 ms. Drained in one go, that is one work item in the pool's eyes
        // (and a thread it takes for blocked); in 1 ms turns it is some 100.
        const int Count = 400;
        var queue = (ThreadPoolDispatchQueue)_loop.ApplicationScheduler;
        var ran = new List<int>(Count);
        var done = new ManualResetEventSlim();
        long turnsBefore = queue.Turns;
        Action<object?>? step = null;
        step = state =>
        {
            int i = (int)state!;
            lock (ran)
            {
                ran.Add(i);
            }

            if (i + 2 < Count)
            {
                queue.Schedule(step!, i + 2);
            }

            var spin = Stopwatch.StartNew();
            while (spin.Elapsed < TimeSpan.FromMicroseconds(250))
            {
            }

            if (i == Count - 1)
            {
                done.Set();
            }
        };

        queue.Schedule(step, 0);
        queue.Schedule(step, 1);
        Assert.True(done.Wait(TimeSpan.FromSeconds(30)), "the busy batch never finished");

        long turns = queue.Turns - turnsBefore;
        Assert.True(turns >= 10, $"the batch ran {Count} continuations of 250 µs in {turns} turn(s); it should yield its pool thread every millisecond");
        lock (ran)
        {
            // Each exactly once. (Not necessarily in order: on a starved machine a continuation can be
            // off its CPU for over 50 ms, and HelpIfStalled then adds a second drainer.)
            ran.Sort();
            Assert.Equal(Enumerable.Range(0, Count), ran);
        }
    }

    [Theory]
    [InlineData(true, "flush,a,b,send")]
    [InlineData(false, "flush,send,a,b")]
    public void A_send_flushed_in_a_batch_joins_its_end_only_when_coalescing(bool coalesce, string expected)
    {
        // A continuation in the batch queues two more (other connections' requests, say), then flushes:
        // the send's continuation goes behind them when coalescing, ahead of them otherwise.
        var queue = (ThreadPoolDispatchQueue)_loop.ApplicationScheduler;
        var sends = queue.CreateSendScheduler(coalesce);
        var order = new List<string>();
        var done = new CountdownEvent(4);
        Action<object?> record = state =>
        {
            lock (order)
            {
                order.Add((string)state!);
            }

            done.Signal();
        };

        queue.Schedule(state =>
        {
            record("flush");
            queue.Schedule(record, "a");
            queue.Schedule(record, "b");
            sends.Schedule(record, "send");
        }, null);

        Assert.True(done.Wait(Release), "the batch never ran all four");
        lock (order)
        {
            Assert.Equal(expected, string.Join(",", order));
        }
    }

    /// <summary>
    /// A continuation that posts to the loop and blocks its pool thread until the loop has run it.
    /// It records what it saw instead of asserting: an exception on a dispatch-queue thread would take
    /// the test host down rather than fail the test.
    /// </summary>
    private Action<object?> WaitsForTheLoop(Outcome outcome, bool afterTheLoopSleeps) => _ =>
    {
        outcome.LoopSlept = !afterTheLoopSleeps || LoopSleeps();
        var ran = new ManualResetEventSlim(); // not disposed: a late Set from the loop must not throw
        _loop.Post(static s => ((ManualResetEventSlim)s!).Set(), ran);
        outcome.Released = ran.Wait(Release);
        outcome.Done.Set();
    };

    private static void AssertReleased(Outcome outcome, int round, string failure)
    {
        Assert.True(outcome.Done.Wait(Release * 2), $"round {round}: the continuation never finished");
        Assert.True(outcome.LoopSlept, $"round {round}: the loop thread never went to sleep");
        Assert.True(outcome.Released, $"round {round}: {failure}");
    }

    /// <summary>True once the loop thread is asleep in epoll_wait (nothing else runs on it here).</summary>
    private bool LoopSleeps() => LoopThread.WaitUntilAsleep(_loop, Release, samplesInARow: 3);

    /// <summary>What a continuation saw; written on its pool thread, read after <see cref="Done"/>.</summary>
    private sealed class Outcome
    {
        public ManualResetEventSlim Done { get; } = new();

        public bool LoopSlept { get; set; } = true;

        public bool Released { get; set; }
    }
}
