namespace Kestrel.Transport.Linux.Loop;

/// <summary>
/// Which thread holds an <see cref="EventLoop"/> (see its remarks): the holder's managed thread id, for
/// <see cref="IsCurrentThread"/>, and its <see cref="LoopRunner"/>, which the monitor watches. A thread takes hold with
/// <see cref="Begin"/>; the monitor takes the loop from a holder stuck in a continuation with <see cref="TryTake"/>,
/// which clears both until the next holder begins; the thread that ends the loop says so (<see cref="Ending"/>,
/// <see cref="Ended"/>) and <see cref="Join"/> waits for it.
/// </summary>
internal sealed class LoopHold(EventLoop loop)
{
    private int _holderThreadId;
    private int _threadId;
    private LoopRunner? _runner;
    private Thread? _finalThread;

    /// <summary>True on the thread that holds the loop now.</summary>
    public bool IsCurrentThread => Volatile.Read(ref _holderThreadId) == Environment.CurrentManagedThreadId;

    /// <summary>The kernel's id of the thread that holds the loop, or held it last (0 until it runs).</summary>
    public int ThreadId => Volatile.Read(ref _threadId);

    /// <summary>The current hold (the monitor's view); null before the loop starts and between a take and the next holder.</summary>
    public LoopRunner? Runner => Volatile.Read(ref _runner);

    /// <summary>The calling thread takes hold of the loop: from now on it is the loop thread.</summary>
    public LoopRunner Begin()
    {
        var runner = new LoopRunner(loop);
        Volatile.Write(ref _holderThreadId, runner.ManagedThreadId);
        Volatile.Write(ref _threadId, runner.ThreadId);
        Volatile.Write(ref _runner, runner);
        if (Thread.CurrentThread.Name != loop.ThreadName)
        {
            Thread.CurrentThread.Name = loop.ThreadName; // a standby taking over, named for the loop it holds now
        }

        LoopThreadPolicy.Apply(loop.Options, loop.Index, loop.Logger);
        return runner;
    }

    /// <summary>
    /// Monitor thread: takes the loop from <paramref name="runner"/>, whose continuation began at
    /// <paramref name="started"/> and still runs. True when taken: nobody holds the loop until the caller hands
    /// it to another thread (which calls <see cref="EventLoop.RunPasses"/>).
    /// </summary>
    public bool TryTake(LoopRunner runner, long started)
    {
        if (!runner.TryTake(started))
        {
            return false;
        }

        Volatile.Write(ref _holderThreadId, 0);
        Interlocked.CompareExchange(ref _runner, null, runner);
        return true;
    }

    /// <summary>The holder is about to end the loop: <see cref="Join"/> waits for this thread.</summary>
    public void Ending() => Volatile.Write(ref _finalThread, Thread.CurrentThread);

    /// <summary>The holder has ended the loop: no thread holds it any more.</summary>
    public void Ended() => Volatile.Write(ref _holderThreadId, 0);

    /// <summary>
    /// Waits until the loop has ended (<paramref name="stopped"/>) and the thread that ended it has exited (from a thread
    /// other than the loop's). A thread the loop was taken from may still be inside an application continuation.
    /// </summary>
    public void Join(Thread first, Task stopped)
    {
        if (!first.IsAlive && Volatile.Read(ref _finalThread) is null)
        {
            return; // never started
        }

        stopped.GetAwaiter().GetResult();
        var final = Volatile.Read(ref _finalThread);
        if (final is not null && final != Thread.CurrentThread)
        {
            final.Join();
        }
    }
}
