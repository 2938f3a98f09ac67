using System.Collections.Concurrent;
using Kestrel.Transport.Linux.Scheduling;

namespace Kestrel.Transport.Linux.Loop;

/// <summary>
/// The continuations a group's loops give to the group's threads instead of running them, during a storm of blocking
/// ones (<see cref="LoopContinuations"/>): each runs on a thread that holds no loop, as on a thread pool. The threads come
/// from <see cref="LoopThreads"/> (waiting standbys, or new ones up to the ceiling), and the threads already draining
/// start more while the queue outnumbers the threads on their way: two each, so a storm of 200 has its threads after a
/// few thread starts in a row, not 200, and a loop starts at most one itself (Thread.Start waits for the new thread to
/// run, about 0.1 ms, and up to 100 ms on this busy machine: a loop that started one per continuation stalled for
/// hundreds of milliseconds).
/// </summary>
internal sealed class LoopSpills(LoopThreads threads)
{
    private readonly ConcurrentQueue<Spilled> _queue = new();
    private readonly Lock _gate = new();

    // Under _gate: continuations queued and not yet taken, and threads given the queue that have not begun to take from it.
    private int _backlog;
    private int _coming;

    /// <summary>
    /// The loop's holder: queues <paramref name="work"/> for a thread of the group. False when no thread can be had (the
    /// ceiling, the group stopping, a thread that cannot start): the holder runs it itself.
    /// </summary>
    public bool TrySpill(Continuation work, LoopContinuations from, string threadName)
    {
        var spilled = new Spilled(work, from, threadName);
        lock (_gate)
        {
            if (_coming > 0)
            {
                // A thread on its way drains the queue, and starts more as it goes.
                Enqueue(spilled);
                return true;
            }
        }

        if (threads.ThreadForSpills(threadName) is not { } standby)
        {
            return false;
        }

        lock (_gate)
        {
            _coming++;
            Enqueue(spilled);
        }

        standby.Assign(null, drain: true);
        return true;
    }

    /// <summary>A thread of the group, given the queue: runs what is queued until nothing is, starting more threads meanwhile.</summary>
    public void Drain()
    {
        lock (_gate)
        {
            _coming--;
        }

        while (TryTake(out var spilled))
        {
            Grow(spilled.ThreadName);
            Grow(spilled.ThreadName);
            spilled.From.RunSpilled(spilled.Work);
        }
    }

    private void Enqueue(Spilled spilled)
    {
        _queue.Enqueue(spilled);
        _backlog++;
    }

    private bool TryTake(out Spilled spilled)
    {
        lock (_gate)
        {
            if (!_queue.TryDequeue(out spilled))
            {
                return false;
            }

            _backlog--;
            return true;
        }
    }

    /// <summary>One more thread for the queue, while it holds more than the threads on their way will take.</summary>
    private void Grow(string threadName)
    {
        lock (_gate)
        {
            if (_backlog <= _coming)
            {
                return;
            }

            _coming++;
        }

        if (threads.ThreadForSpills(threadName) is { } standby)
        {
            standby.Assign(null, drain: true);
            return;
        }

        lock (_gate)
        {
            _coming--;
        }
    }

    /// <summary>A continuation a loop spilled, where it came from, and the name its threads take.</summary>
    private readonly record struct Spilled(Continuation Work, LoopContinuations From, string ThreadName);
}
