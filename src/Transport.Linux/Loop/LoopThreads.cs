using System.Diagnostics;

namespace Kestrel.Transport.Linux.Loop;

/// <summary>
/// The threads that may hold a group's loops (Adaptive scheduling): each loop's first thread, and standbys that
/// take over a loop the monitor took from its holder (<see cref="TryHandOver"/>). A thread the loop was taken
/// from finishes its continuation and then waits as a standby. A standby that waits longer than the retire time (1 s
/// past the soft cap) exits, unless it held a loop and <see cref="KeepEveryThread"/>; every standby exits when the
/// group ends (<see cref="Stop"/>).
/// </summary>
/// <remarks>
/// <para>How many: threads up to a soft cap start whenever a loop needs one. Past it, a loop whose holder is asleep
/// in the kernel still gets one every <see cref="BlockedInjectionInterval"/>, one that computes every
/// <see cref="ComputingInjectionInterval"/>, up to a hard ceiling; work posted to a held loop that only it can do (a
/// stop, an unbind) gets one whatever the count. So a loop whose holder waits for something only the loop can deliver
/// (a relay between two of its connections, a synchronous read of a body) always has a way forward, as the thread
/// pool injects threads when its work items block, only much sooner: a held loop stalls every connection on it.</para>
/// <para>The thread for a hand-off exists and waits before the loop is taken from its holder, so a thread that cannot
/// start (pids.max, RLIMIT_NPROC, memory) refuses the hand-off and leaves the loop where it was.</para>
/// <para>During a storm of blocking continuations a loop gives the continuations it would run to these threads instead
/// (<see cref="Spills"/>), up to the ceiling: they run as on a thread pool that adds a thread whenever all of its threads
/// block, which the .NET pool does not.</para>
/// </remarks>
internal sealed class LoopThreads(int loops, int softCap, int ceiling, TimeSpan retireAfter)
{
    /// <summary>
    /// Past the soft cap, a loop held by a thread asleep in the kernel gets another thread at most this often (2 ms:
    /// about as often as the monitor can see one blocked holder after another, so a storm of first-time blockers is
    /// handed off at the pace the monitor finds them; the ceiling bounds the total).
    /// </summary>
    private static readonly long BlockedInjectionInterval = Stopwatch.Frequency / 500;

    /// <summary>Past the soft cap, a loop held by a computing thread gets another at most this often (100 ms): a computation ends by itself, and more threads only share the same CPUs.</summary>
    private static readonly long ComputingInjectionInterval = Stopwatch.Frequency / 10;

    /// <summary>How long a standby past the soft cap waits before it exits (1 s): long enough to serve the rest of a storm, short enough that its threads do not outlive it.</summary>
    private static readonly TimeSpan ExtraRetireAfter = TimeSpan.FromSeconds(1);

    private readonly Lock _gate = new();
    private readonly List<Standby> _waiting = [];
    private readonly long[] _lastInjection = new long[loops];
    private int _threads;
    private bool _stopping;
    private bool _keepEveryThread;

    /// <summary>What a loop needs a thread for, which decides how the caps apply.</summary>
    public enum Need
    {
        /// <summary>Its holder is asleep in the kernel inside application code.</summary>
        Blocked,

        /// <summary>Its holder has computed inside application code past the running threshold.</summary>
        Computing,

        /// <summary>Work only the loop can do (a stop, a listener to add or remove) waits behind a held loop: no cap applies.</summary>
        Control,
    }

    /// <summary>Why <see cref="TryHandOver"/> did not hand the loop over.</summary>
    public enum Outcome
    {
        HandedOver,

        /// <summary>The hard ceiling is reached: the loop stays with its holder (counted, logged).</summary>
        AtCeiling,

        /// <summary>Past the soft cap, this loop had a new thread too recently: the monitor asks again at a later look.</summary>
        NotYet,

        /// <summary>Thread.Start threw (counted, logged; <see cref="LastStartFailure"/>).</summary>
        StartFailed,

        /// <summary>The continuation returned before the take, or the group stops.</summary>
        NotTaken,
    }

    /// <summary>Threads alive in this set: holding a loop, finishing a continuation the loop was taken from, or waiting.</summary>
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

    /// <summary>Standbys waiting for a loop.</summary>
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

    /// <summary>The most threads this set may ever have, but for <see cref="Need.Control"/> (tests).</summary>
    internal int Ceiling => ceiling;

    /// <summary>The continuations the loops spill to these threads during a storm of blocking ones.</summary>
    public LoopSpills Spills => _spills ??= new LoopSpills(this);

    private LoopSpills? _spills;

    /// <summary>Starts a thread this set created (a seam: tests make it throw, as pids.max or RLIMIT_NPROC would).</summary>
    internal Action<Thread> StartThread { get; set; } = static thread => thread.Start();

    /// <summary>What Thread.Start threw when <see cref="TryHandOver"/> last returned <see cref="Outcome.StartFailed"/>.</summary>
    public Exception? LastStartFailure { get; private set; }

    /// <summary>
    /// The body of a loop's first thread (<paramref name="threads"/> null: a loop without a monitor, whose thread only
    /// runs it): holds <paramref name="loop"/> until it ends or is taken, then serves as a standby.
    /// </summary>
    public static void Serve(EventLoop loop, LoopThreads? threads)
    {
        if (threads is null)
        {
            loop.RunPasses();
            return;
        }

        threads.Run(loop);
    }

    /// <summary>
    /// Before the loops start: threads that held a loop wait as standbys until <see cref="Stop"/>. For movable io_uring
    /// rings, whose polls and accepts the kernel cancels when the thread that armed them exits (<see cref="Engines.UringEngine.CanChangeThreads"/>).
    /// </summary>
    public void KeepEveryThread() => _keepEveryThread = true;

    /// <summary>A loop's first thread is about to start (counted before it runs, so the caps hold).</summary>
    public void Joining()
    {
        lock (_gate)
        {
            _threads++;
        }
    }

    /// <summary>
    /// Monitor thread: finds a thread for <paramref name="loop"/> (a waiting standby, or a new one the caps allow for
    /// <paramref name="need"/>), started and waiting, and only then takes the loop from <paramref name="runner"/>, whose
    /// continuation began at <paramref name="started"/> (<see cref="EventLoop.TryTake"/>); when that succeeds, hands the
    /// loop to the thread.
    /// </summary>
    public Outcome TryHandOver(EventLoop loop, LoopRunner runner, long started, Need need)
    {
        Standby? standby = null;
        lock (_gate)
        {
            if (_stopping)
            {
                return Outcome.NotTaken;
            }

            if (_waiting.Count > 0)
            {
                standby = _waiting[^1];
                _waiting.RemoveAt(_waiting.Count - 1);
            }
            else if (need != Need.Control && _threads >= softCap)
            {
                if (_threads >= ceiling)
                {
                    return Outcome.AtCeiling;
                }

                long now = Stopwatch.GetTimestamp();
                long interval = need == Need.Blocked ? BlockedInjectionInterval : ComputingInjectionInterval;
                if (now - _lastInjection[loop.Index] < interval)
                {
                    return Outcome.NotYet;
                }

                _lastInjection[loop.Index] = now;
            }

            if (standby is null)
            {
                _threads++; // reserved for the thread started below
            }
        }

        if (standby is null && (standby = TryStart(loop.ThreadName)) is null)
        {
            return Outcome.StartFailed;
        }

        if (!loop.TryTake(runner, started))
        {
            Return(standby);
            return Outcome.NotTaken;
        }

        standby.Assign(loop);
        return Outcome.HandedOver;
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

    /// <summary>
    /// For <see cref="LoopSpills"/>: a thread to drain the spill queue, a waiting standby or one started now up to the
    /// ceiling, not yet assigned; null when none can be had.
    /// </summary>
    public Standby? ThreadForSpills(string threadName)
    {
        lock (_gate)
        {
            if (_stopping || (_waiting.Count == 0 && _threads >= ceiling))
            {
                return null;
            }

            if (_waiting.Count > 0)
            {
                var standby = _waiting[^1];
                _waiting.RemoveAt(_waiting.Count - 1);
                return standby;
            }

            _threads++;
        }

        return TryStart(threadName);
    }

    /// <summary>Starts a thread (already counted) that waits for its first assignment; null when Thread.Start threw.</summary>
    private Standby? TryStart(string threadName)
    {
        var standby = new Standby();
        try
        {
            StartThread(new Thread(() => Run(standby)) { IsBackground = true, Name = threadName });
            return standby;
        }
        catch (Exception e)
        {
            LastStartFailure = e;
            Left();
            return null;
        }
    }

    /// <summary>The body of a thread this set started for a hand-off or a spill: it waits for what it was started for.</summary>
    private void Run(Standby first) => Serve(first, heldALoop: false);

    /// <summary>The body of a loop's first thread: holds the loop until it ends or is taken, then serves as a standby.</summary>
    private void Run(EventLoop loop)
    {
        if (loop.RunPasses())
        {
            Left();
            return;
        }

        if (Enlist(heldALoop: true) is { } standby)
        {
            Serve(standby, heldALoop: true);
        }
        else
        {
            Left();
        }
    }

    /// <summary>
    /// A standby's life: each time it is given something, it holds a loop (until the loop ends, when the thread exits, or
    /// is taken) or runs a spilled continuation, and then waits again, until it retires, is not needed, or the group stops.
    /// </summary>
    private void Serve(Standby standby, bool heldALoop)
    {
        while (WaitFor(standby, heldALoop))
        {
            if (standby.Loop is { } loop)
            {
                heldALoop = true;
                if (loop.RunPasses())
                {
                    break;
                }
            }
            else if (standby.Drain)
            {
                Spills.Drain();
            }

            if (Enlist(heldALoop) is not { } next)
            {
                break;
            }

            standby = next;
        }

        Left();
    }

    private void Left()
    {
        lock (_gate)
        {
            _threads--;
        }
    }

    /// <summary>A standby the monitor picked for a loop it then could not take: back in line (or gone, if the group stops).</summary>
    private void Return(Standby standby)
    {
        lock (_gate)
        {
            if (!_stopping)
            {
                _waiting.Add(standby);
                return;
            }
        }

        standby.Assign(null);
    }

    /// <summary>
    /// A thread that is done with a loop or a spilled continuation: a standby to wait on, or null when the group stops.
    /// It retires when idle (<see cref="WaitFor"/>), unless it held a movable ring's loop (<see cref="KeepEveryThread"/>).
    /// </summary>
    private Standby? Enlist(bool heldALoop)
    {
        var standby = new Standby { Extra = !(_keepEveryThread && heldALoop) };
        lock (_gate)
        {
            if (_stopping)
            {
                return null;
            }

            standby.Extra &= _threads > softCap;
            _waiting.Add(standby);
        }

        return standby;
    }

    /// <summary>
    /// Waits until <paramref name="standby"/> is given something (false: exit), retiring when idle: after the retire time,
    /// or sooner for one past the soft cap, so that a storm's threads do not outlive it by long; never, for one that held a
    /// movable ring's loop.
    /// </summary>
    private bool WaitFor(Standby standby, bool heldALoop)
    {
        var timeout = _keepEveryThread && heldALoop ? Timeout.InfiniteTimeSpan : standby.Extra ? ExtraRetireAfter : retireAfter;
        while (!standby.Wait(timeout))
        {
            lock (_gate)
            {
                // Retire, unless the monitor took this standby from the list just now and is assigning it a loop.
                if (_waiting.Remove(standby))
                {
                    return false;
                }
            }
        }

        return standby.Loop is not null || standby.Drain;
    }

    /// <summary>A waiting thread, and what it is given: a loop to hold, the spill queue to drain, or nothing (exit). It waits on a monitor: no spinning.</summary>
    internal sealed class Standby
    {
        private readonly object _gate = new();
        private bool _assigned;

        public EventLoop? Loop { get; private set; }

        /// <summary>Given <see cref="LoopSpills"/>'s queue to drain.</summary>
        public bool Drain { get; private set; }

        /// <summary>Enlisted past the soft cap: retires sooner.</summary>
        public bool Extra { get; set; }

        public void Assign(EventLoop? loop, bool drain = false)
        {
            lock (_gate)
            {
                Loop = loop;
                Drain = drain;
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
