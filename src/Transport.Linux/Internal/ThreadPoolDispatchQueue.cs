using System.Collections.Concurrent;
using System.IO.Pipelines;

namespace Kestrel.Transport.Linux.Internal;

/// <summary>
/// Hands continuations to the thread pool in batches: however many connections a loop pass wakes,
/// the pass costs one thread-pool work item, and queuing one allocates nothing (this object is the
/// work item). The same idea as Kestrel's IOQueue; one queue per event loop.
/// </summary>
internal sealed class ThreadPoolDispatchQueue : PipeScheduler, IThreadPoolWorkItem
{
    private readonly ConcurrentQueue<ScheduledWork> _queue = new();
    private int _scheduled;

    public override void Schedule(Action<object?> action, object? state)
    {
        _queue.Enqueue(new ScheduledWork(action, state));
        if (Interlocked.CompareExchange(ref _scheduled, 1, 0) == 0)
        {
            System.Threading.ThreadPool.UnsafeQueueUserWorkItem(this, preferLocal: false);
        }
    }

    void IThreadPoolWorkItem.Execute()
    {
        while (true)
        {
            while (_queue.TryDequeue(out var work))
            {
                work.Run();
            }

            Volatile.Write(ref _scheduled, 0);

            // Work enqueued after the drain but before the flag cleared saw _scheduled == 1 and did
            // not queue us: look again, and stay scheduled only if nobody else took over.
            if (_queue.IsEmpty || Interlocked.CompareExchange(ref _scheduled, 1, 0) != 0)
            {
                return;
            }
        }
    }
}

/// <summary>A continuation and its state, queued without a closure.</summary>
internal readonly struct ScheduledWork(Action<object?> action, object? state)
{
    public void Run() => action(state);
}
