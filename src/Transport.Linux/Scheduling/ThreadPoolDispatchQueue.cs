using System.Collections.Concurrent;
using System.Diagnostics;
using System.IO.Pipelines;
using Kestrel.Transport.Linux.Interop;
using Kestrel.Transport.Linux.Loop;

namespace Kestrel.Transport.Linux.Scheduling;

/// <summary>
/// Hands continuations to the thread pool in batches: however many connections a loop pass wakes,
/// the pass costs one thread-pool work item, and queuing one allocates nothing (this object is the
/// work item). The same idea as Kestrel's IOQueue; one queue per event loop. Work the batch posts
/// back to its loop wakes the loop once, when the batch ends.
/// </summary>
internal sealed class ThreadPoolDispatchQueue(EventLoop loop, LoopWakeup wakeup) : PipeScheduler, IThreadPoolWorkItem
{
    /// <summary>A continuation running longer than this with work queued behind it gets help (1 ms).</summary>
    private static readonly long s_stallTicks = Stopwatch.Frequency / 1000;

    /// <summary>A continuation running longer than this with work queued behind it gets help whatever its thread's state (50 ms).</summary>
    private static readonly long s_forceHelpTicks = Stopwatch.Frequency / 20;

    /// <summary>
    /// How long one turn of the batch keeps its pool thread (1 ms) before it queues itself again behind
    /// the pool's other work. The thread pool sizes itself from work-item completions (hill climbing)
    /// and from how recently it dequeued anything (starvation detection), and it takes a work item that
    /// never returns for a blocked thread: a batch that drained for as long as a busy loop kept feeding
    /// it showed the pool some 10 completions a second, and the pool answered with up to 9 workers on
    /// one CPU (ClimbingMove and Starvation adjustments), which then spun and contended for the pipes'
    /// locks. Kestrel's Sockets transport shows it tens of thousands. The turn is timed with the clock
    /// the batch already reads for every continuation.
    /// </summary>
    private static readonly long s_turnTicks = Stopwatch.Frequency / 1000;

    [ThreadStatic]
    private static ThreadPoolDispatchQueue? t_running;

    [ThreadStatic]
    private static bool t_wakeDeferred;

    [ThreadStatic]
    private static int t_threadId;

    private readonly ConcurrentQueue<ScheduledWork> _queue = new();

    /// <summary>Sends that go ahead of the batch (<see cref="CreateSendScheduler"/> without coalescing): taken before anything in <see cref="_queue"/>.</summary>
    private readonly ConcurrentQueue<ScheduledWork> _sends = new();
    private int _scheduled;
    private int _running;
    private long _itemStarted;
    private int _itemThread;
    private long _lastProbe;
    private int _statPathThread;
    private string _statPath = "";
    private long _turns;

    private string StatPath(int tid)
    {
        if (_statPathThread != tid)
        {
            _statPath = $"/proc/self/task/{tid}/stat";
            _statPathThread = tid;
        }

        return _statPath;
    }

    /// <summary>
    /// The scheduler for the transport's reader of the app's output, when sends go out from the thread
    /// pool (<see cref="Hosting.TransportTuning.SendFromThreadPool"/>). A flush on a pool thread queues the
    /// reader's continuation in this batch, where any thread draining it (a helper, when the one that
    /// flushed blocks) can run it; one on the loop (a cancelled read) stays on the loop. With
    /// <paramref name="coalesce"/> (<see cref="Hosting.TransportTuning.CoalesceThreadPoolSends"/>) the send
    /// joins the end of the batch, behind the continuations already waiting, so a batch's responses
    /// go out back to back; without, it goes ahead of them (<see cref="TryTake"/>).
    /// </summary>
    public PipeScheduler CreateSendScheduler(bool coalesce) => new SendReaderScheduler(this, coalesce ? _queue : _sends, loop);

    private sealed class SendReaderScheduler(ThreadPoolDispatchQueue queue, ConcurrentQueue<ScheduledWork> sends, EventLoop loop) : PipeScheduler
    {
        public override void Schedule(Action<object?> action, object? state)
        {
            if (loop.IsLoopThread)
            {
                loop.Schedule(action, state);
            }
            else
            {
                queue.Enqueue(sends, new ScheduledWork(action, state));
            }
        }
    }

    /// <summary>True from the moment a batch is queued until every thread running it has finished.</summary>
    public bool IsActive => Volatile.Read(ref _scheduled) != 0 || Volatile.Read(ref _running) > 0;

    /// <summary>How many turns batches have taken on pool threads (tests).</summary>
    internal long Turns => Volatile.Read(ref _turns);

    /// <summary>True on a thread-pool thread that is running this queue's batch.</summary>
    public bool IsBatchThread => t_running == this;

    public override void Schedule(Action<object?> action, object? state) => Enqueue(_queue, new ScheduledWork(action, state));

    private void Enqueue(ConcurrentQueue<ScheduledWork> queue, ScheduledWork work)
    {
        queue.Enqueue(work);
        if (Interlocked.CompareExchange(ref _scheduled, 1, 0) == 0)
        {
            System.Threading.ThreadPool.UnsafeQueueUserWorkItem(this, preferLocal: false);
        }
        else if (t_running != this && !loop.IsLoopThread)
        {
            // Queued behind a batch that may be blocked, by a thread that is neither the loop nor the
            // batch: make sure the loop polls, so that HelpIfStalled can see it.
            wakeup.WakeIfNotPolling();
        }
    }

    /// <summary>
    /// The next work item: a send that goes ahead of the batch first, so that it runs right after the
    /// continuation that flushed returns, carrying everything it flushed (all the responses of a
    /// pipelined batch, say). Coalesced sends are in <see cref="_queue"/>, in turn.
    /// </summary>
    private bool TryTake(out ScheduledWork work) => _sends.TryDequeue(out work) || _queue.TryDequeue(out work);

    private bool IsEmpty => _sends.IsEmpty && _queue.IsEmpty;

    /// <summary>
    /// Called by the loop, on this queue's batch thread, when work posted to the loop may wait for
    /// the batch to end: the batch wakes the loop once, as it finishes.
    /// </summary>
    public static void WakeLoopAtBatchEnd() => t_wakeDeferred = true;

    /// <summary>
    /// Called by the loop on every pass while a batch runs. A batch runs continuations one after the
    /// other, so an app that blocks in one (synchronous body I/O) could wait forever for a continuation
    /// queued behind it; when one has run for over a millisecond with work waiting and its thread is
    /// blocked in the kernel (or it has run for 50 ms whatever its state), another thread-pool thread
    /// drains the queue too, as the thread pool itself would have run them in parallel.
    /// </summary>
    public void HelpIfStalled()
    {
        // Called on every loop pass: the common case (nothing running, or nothing waiting behind it)
        // returns before reading the clock.
        long started = Volatile.Read(ref _itemStarted);
        if (started == 0 || IsEmpty)
        {
            return;
        }

        long now = Stopwatch.GetTimestamp();
        if (now - started <= s_stallTicks || now - _lastProbe <= s_stallTicks)
        {
            return;
        }

        // A continuation that has been running for a while may only have been preempted: on a busy
        // machine (or a single CPU shared with the loop) that is the common case, and a second drainer
        // would only compete with the first for the same CPU and the same pipes. So within the first
        // 50 ms help only a thread that is really blocked (sleeping in the kernel; looked at no more
        // than once per millisecond); after that help anyway, since a wait can also spin or yield.
        _lastProbe = now;
        if (now - started <= s_forceHelpTicks)
        {
            int tid = Volatile.Read(ref _itemThread);
            if (tid == 0 || !Affinity.IsThreadBlocked(StatPath(tid)))
            {
                return;
            }
        }

        if (Interlocked.CompareExchange(ref _itemStarted, now, started) == started)
        {
            System.Threading.ThreadPool.UnsafeQueueUserWorkItem(this, preferLocal: false);
        }
    }

    void IThreadPoolWorkItem.Execute()
    {
        t_running = this;
        int threadId = t_threadId == 0 ? (t_threadId = Affinity.CurrentThreadId()) : t_threadId;
        Interlocked.Increment(ref _running);
        Interlocked.Increment(ref _turns);
        try
        {
            long turnEnds = Stopwatch.GetTimestamp() + s_turnTicks;
            while (true)
            {
                while (TryTake(out var work))
                {
                    long now = Stopwatch.GetTimestamp();
                    Volatile.Write(ref _itemThread, threadId);
                    Volatile.Write(ref _itemStarted, now);
                    work.Run();

                    if (now >= turnEnds && !IsEmpty)
                    {
                        // The turn is over with work left: hand the thread back to the pool and queue
                        // the rest behind what the pool already holds. _scheduled stays 1, so nobody
                        // else queues the batch meanwhile, and nothing is left behind.
                        Volatile.Write(ref _itemStarted, 0);
                        System.Threading.ThreadPool.UnsafeQueueUserWorkItem(this, preferLocal: false);
                        return;
                    }
                }

                Volatile.Write(ref _itemStarted, 0);

                // A full fence, not Volatile.Write: the look at the queue below must not pass the store that
                // clears the flag (x64 lets a load pass an earlier store), or it could see the queue empty
                // while a producer still saw the flag set, leaving its work queued with nothing to run it.
                Interlocked.Exchange(ref _scheduled, 0);

                // Work enqueued after the drain but before the flag cleared saw _scheduled == 1 and did
                // not queue us: look again, and stay scheduled only if nobody else took over.
                if (IsEmpty || Interlocked.CompareExchange(ref _scheduled, 1, 0) != 0)
                {
                    return;
                }
            }
        }
        finally
        {
            Interlocked.Decrement(ref _running);
            t_running = null;
            if (t_wakeDeferred)
            {
                t_wakeDeferred = false;
                wakeup.Wake();
            }
        }
    }
}

/// <summary>A continuation and its state, queued without a closure.</summary>
internal readonly struct ScheduledWork(Action<object?> action, object? state)
{
    public void Run() => action(state);
}
