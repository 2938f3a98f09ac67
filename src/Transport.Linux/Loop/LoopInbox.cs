using System.Collections.Concurrent;
using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Scheduling;

namespace Kestrel.Transport.Linux.Loop;

/// <summary>
/// The work any thread posts to one loop (<see cref="EventLoop.Schedule"/>), which the loop runs in its pass
/// (<see cref="RunQueued"/>), and the wake-up that tells a waiting loop there is some (<see cref="LoopWakeup"/>).
/// Control work (a listener added or removed, the loop's stop: what an unbind or a stop waits for) is counted until it
/// runs, so that the monitor hands a loop that application code holds to another thread for it, whatever the caps on
/// threads (<see cref="HasControlWork"/>). Once the loop has ended (<see cref="Close"/>) the thread pool runs what is
/// posted, so pipes still complete.
/// </summary>
internal sealed class LoopInbox(EventLoop loop, LoopWakeup wakeup, ThreadPoolDispatchQueue? dispatchQueue)
{
    private readonly ConcurrentQueue<ScheduledWork> _queue = new();
    private int _controlPending;
    private bool _closed;

    public bool IsEmpty => _queue.IsEmpty;

    /// <summary>True while control work waits to run (<see cref="PostControl"/>).</summary>
    public bool HasControlWork => Volatile.Read(ref _controlPending) > 0;

    /// <summary>Runs <paramref name="action"/> on the loop's thread during its next pass.</summary>
    public void Post(Action<object?> action, object? state)
    {
        _queue.Enqueue(new ScheduledWork(action, state));
        if (Volatile.Read(ref _closed))
        {
            // The loop is gone: let the thread pool run what is left so pipes still complete.
            DrainToThreadPool();
            return;
        }

        if (loop.IsLoopThread)
        {
            if (loop.Continuations is null)
            {
                return;
            }

            // The loop may be taken from this thread at any time (Adaptive): only a check after the enqueue is
            // visible tells that its next holder will see the work.
            Interlocked.MemoryBarrier();
            if (loop.IsLoopThread)
            {
                return;
            }
        }

        // Continuations that this loop's own dispatch batch schedules (each response flush of a pipelined
        // batch, say) wake the loop once when the batch ends, not once per flush. That is safe only while the
        // loop is sure to look again without it: awake (it checks the queue before it sleeps), already
        // notified, or polling because it knew of the batch. A loop that went to sleep before the batch was
        // queued could otherwise sleep forever under a batch that blocks (synchronous body I/O waiting for
        // this very loop), so that one is woken now.
        if (dispatchQueue is not null && dispatchQueue.IsBatchThread)
        {
            Interlocked.MemoryBarrier(); // the enqueue above before the read of the state (LoopWakeup)
            if (!wakeup.IsSleeping)
            {
                ThreadPoolDispatchQueue.WakeLoopAtBatchEnd();
                return;
            }
        }

        wakeup.Wake();
    }

    /// <summary>As <see cref="Post"/>, for control work: counted from now until it starts to run. Rare, so it may allocate.</summary>
    public void PostControl(Action<object?> action, object? state)
    {
        Interlocked.Increment(ref _controlPending);
        Post(static s =>
        {
            var (inbox, action, state) = ((LoopInbox, Action<object?>, object?))s!;
            Interlocked.Decrement(ref inbox._controlPending);
            action(state);
        }, (this, action, state));
    }

    /// <summary>
    /// The loop's thread: runs only what was queued before this point: work queued by this work runs next pass, so a
    /// connection that keeps rescheduling itself cannot starve the engine's wait.
    /// </summary>
    public void RunQueued()
    {
        int count = _queue.Count;
        while (count-- > 0 && _queue.TryDequeue(out var work))
        {
            try
            {
                work.Run();
            }
            catch (Exception e)
            {
                TransportLog.ScheduledWorkFailed(loop.Logger, loop.Index, e);
            }
        }
    }

    /// <summary>The loop has ended: what is queued now or later runs on the thread pool.</summary>
    public void Close()
    {
        Volatile.Write(ref _closed, true);
        DrainToThreadPool();
    }

    private void DrainToThreadPool()
    {
        while (_queue.TryDequeue(out var work))
        {
            ThreadPool.UnsafeQueueUserWorkItem(static w => w.Run(), work, preferLocal: false);
        }

        loop.Continuations?.DrainToThreadPool();
    }
}
