using Kestrel.Transport.Linux.Engines;

namespace Kestrel.Transport.Linux.Loop;

/// <summary>
/// The wake-up protocol between a loop and the threads that post work to it. The loop says when it may block
/// (<see cref="EnterWait"/>) and when it is back (<see cref="ExitWait"/>); another thread that posts work calls
/// <see cref="Wake"/>, which signals the engine only when the loop may be blocked, and at most once per wait.
/// </summary>
/// <remarks>
/// The order that makes it safe: the poster enqueues its work first and then reads the state (a
/// CompareExchange, or a full barrier and a read); the loop publishes its state first (an Exchange) and then
/// looks at its queue once more before it blocks. One of the two always sees the other: either the loop finds
/// the work, or the poster finds the loop waiting and signals it.
/// </remarks>
internal sealed class LoopWakeup(IoEngine engine)
{
    private const int Awake = 0;
    private const int Sleeping = 1;
    private const int Notified = 2;

    /// <summary>Asleep, but for at most a short poll: a dispatch batch was queued or running.</summary>
    private const int Polling = 3;

    private int _state;

    /// <summary>True while the loop may be blocked with no deadline.</summary>
    public bool IsSleeping => Volatile.Read(ref _state) == Sleeping;

    /// <summary>Loop thread, before it blocks: from now on a poster signals. Look at the queue once more after this.</summary>
    public void EnterWait(bool polling) => Interlocked.Exchange(ref _state, polling ? Polling : Sleeping);

    /// <summary>Loop thread, once the wait returned.</summary>
    public void ExitWait() => Volatile.Write(ref _state, Awake);

    /// <summary>Any thread: signals only when the loop may be blocked, at most once per wait.</summary>
    public void Wake()
    {
        int state = Interlocked.CompareExchange(ref _state, Notified, Sleeping);
        if (state == Sleeping || (state == Polling && Interlocked.CompareExchange(ref _state, Notified, Polling) == Polling))
        {
            engine.Signal();
        }
    }

    /// <summary>
    /// Any thread: signals the loop only if it waits with no deadline, so that it starts polling (and watching
    /// for stalled continuations) while a dispatch batch it did not know of is running.
    /// </summary>
    public void WakeIfNotPolling()
    {
        if (Interlocked.CompareExchange(ref _state, Notified, Sleeping) == Sleeping)
        {
            engine.Signal();
        }
    }
}
