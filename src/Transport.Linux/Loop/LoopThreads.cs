namespace Kestrel.Transport.Linux.Loop;

/// <summary>
/// The threads that may hold a group's loops (Adaptive scheduling): each loop's first thread, and standbys that
/// take over a loop the monitor took from its holder (<see cref="TryHandOver"/>). A thread the loop was taken
/// from finishes its continuation and then waits as a standby, or exits if enough are waiting already. A standby
/// that waits longer than the retire time exits (unless <see cref="KeepEveryThread"/>). Threads are created on
/// demand, and never more than a cap.
/// </summary>
internal sealed class LoopThreads(int loops, int maxThreads, TimeSpan retireAfter)
{
    private readonly Lock _gate = new();
    private readonly List<Standby> _waiting = [];
    private int _threads;
    private bool _stopping;
    private bool _keepEveryThread;

    /// <summary>Threads alive in this set: holding a loop, finishing a continuation the loop was taken from, or waiting (tests).</summary>
    public int Count
    {
        get
        {
            lock (_gate)
            {
                return _threads;
            }
        }
    }

    /// <summary>The most threads this set may ever have (tests).</summary>
    internal int Ceiling => maxThreads;

    /// <summary>Starts a thread this set created (a seam: tests make it throw, as pids.max or RLIMIT_NPROC would).</summary>
    internal Action<Thread> StartThread { get; set; } = static thread => thread.Start();

    /// <summary>Standbys waiting for a loop (tests).</summary>
    public int Waiting
    {
        get
        {
            lock (_gate)
            {
                return _waiting.Count;
            }
        }
    }

    /// <summary>
    /// The body of every thread that holds loops (<paramref name="threads"/> null: a loop without a monitor, whose
    /// thread only runs it): holds <paramref name="loop"/> until it ends or is taken, then serves as a standby.
    /// </summary>
    public static void Serve(EventLoop loop, LoopThreads? threads)
    {
        EventLoop? next = loop;
        while (next is not null && !next.RunPasses())
        {
            next = threads?.WaitForLoop();
        }

        threads?.Left();
    }

    /// <summary>
    /// Before the loops start: no thread of this set exits before <see cref="Stop"/>. For movable io_uring rings, whose
    /// polls and accepts the kernel cancels when the thread that armed them exits (<see cref="Engines.UringEngine.CanChangeThreads"/>).
    /// </summary>
    public void KeepEveryThread() => _keepEveryThread = true;

    /// <summary>A loop's first thread is about to start (counted before it runs, so the cap holds).</summary>
    public void Joining()
    {
        lock (_gate)
        {
            _threads++;
        }
    }

    /// <summary>
    /// Monitor thread: when a thread is available (a waiting standby, or room for a new one) and
    /// <paramref name="take"/> succeeds, hands <paramref name="loop"/> to that thread and returns true.
    /// </summary>
    public bool TryHandOver(EventLoop loop, Func<bool> take)
    {
        Standby? standby = null;
        lock (_gate)
        {
            if (_stopping || (_waiting.Count == 0 && _threads >= maxThreads) || !take())
            {
                return false;
            }

            if (_waiting.Count > 0)
            {
                standby = _waiting[^1];
                _waiting.RemoveAt(_waiting.Count - 1);
            }
            else
            {
                _threads++;
            }
        }

        if (standby is not null)
        {
            standby.Assign(loop);
        }
        else
        {
            StartThread(new Thread(() => Serve(loop, this)) { IsBackground = true, Name = loop.ThreadName });
        }

        return true;
    }

    /// <summary>Wakes every waiting standby so that it exits; threads still inside a continuation exit when it returns.</summary>
    public void Stop()
    {
        Standby[] waiting;
        lock (_gate)
        {
            _stopping = true;
            waiting = [.. _waiting];
            _waiting.Clear();
        }

        foreach (var standby in waiting)
        {
            standby.Assign(null);
        }
    }

    private void Left()
    {
        lock (_gate)
        {
            _threads--;
        }
    }

    /// <summary>A thread whose loop was taken: waits for another loop, or returns null when it should exit.</summary>
    private EventLoop? WaitForLoop()
    {
        var standby = new Standby();
        lock (_gate)
        {
            if (_stopping || (_waiting.Count >= loops && !_keepEveryThread))
            {
                return null;
            }

            _waiting.Add(standby);
        }

        while (!standby.Wait(_keepEveryThread ? Timeout.InfiniteTimeSpan : retireAfter))
        {
            lock (_gate)
            {
                // Retire, unless the monitor took this standby from the list just now and is assigning it a loop.
                if (_waiting.Remove(standby))
                {
                    return null;
                }
            }
        }

        return standby.Loop;
    }

    /// <summary>A waiting thread, and the loop it is given (null: exit). It waits on a monitor: no spinning.</summary>
    private sealed class Standby
    {
        private readonly object _gate = new();
        private bool _assigned;

        public EventLoop? Loop { get; private set; }

        public void Assign(EventLoop? loop)
        {
            lock (_gate)
            {
                Loop = loop;
                _assigned = true;
                Monitor.Pulse(_gate);
            }
        }

        public bool Wait(TimeSpan timeout)
        {
            lock (_gate)
            {
                return _assigned || (Monitor.Wait(_gate, timeout) && _assigned);
            }
        }
    }
}
