using Kestrel.Transport.Linux.Interop;

namespace Kestrel.Transport.Linux.Engines;

/// <summary>The direction of a batch; the values are ktl.h's.</summary>
internal enum IoDirection
{
    Receive = NativeEngine.Receive,
    Send = NativeEngine.Send,
}

/// <summary>
/// The side of a connection that an op of a batch belongs to: it adds its op when the loop builds the batch,
/// and hears the op's result once the engine has performed it. Loop thread only.
/// </summary>
internal interface IBatchOwner
{
    /// <summary>Adds this owner's op to <paramref name="batch"/>, or nothing when it no longer has one to do.</summary>
    void AddTo(IoBatch batch);

    /// <summary>Bytes moved (0 is end of stream on a receive), or the error, for an op that asked for <paramref name="requested"/>.</summary>
    void Complete(SysResult result, long requested);

    /// <summary><see cref="Complete"/> threw: the owner resets its connection (never the loop).</summary>
    void Fault(Exception error);
}

/// <summary>
/// The kernel interface of one event loop, and the seam between the loop and a backend (<see cref="IoBackend"/>):
/// it registers sockets, waits until some are ready, wakes a waiting loop from other threads, and performs a
/// pass's batch of receives or sends. The loop and the connections know only this class. Owned and used by
/// one loop thread, except <see cref="Signal"/>, which any thread may call.
/// </summary>
internal abstract class IoEngine : IDisposable
{
    /// <summary>The backend as the loop's start-up log names it, for example "epoll, native".</summary>
    public abstract string Name { get; }

    /// <summary>The backend this engine is (never <see cref="IoBackend.Auto"/>; <see cref="IoBackend.Epoll"/> where AIO was asked for but not had).</summary>
    public abstract IoBackend Backend { get; }

    /// <summary>True when batches go through libktl_native.so; false on the managed P/Invoke path.</summary>
    public abstract bool IsNative { get; }

    /// <summary>True when batches go to the kernel as one Linux AIO io_submit.</summary>
    public abstract bool UsesAio { get; }

    /// <summary>
    /// True when the loop may move from one thread to another between passes (Adaptive scheduling): the
    /// engine's kernel objects serve whichever thread calls it, one at a time. False where they belong to the
    /// thread that set them up or submitted to them (an io_uring ring).
    /// </summary>
    public virtual bool CanChangeThreads => true;

    /// <summary>
    /// Called once on the loop thread before anything else: binds the kernel state that belongs to one thread
    /// (an io_uring ring with a single issuer). Throws when the engine cannot run.
    /// </summary>
    public virtual void Start()
    {
    }

    /// <summary>Starts watching <paramref name="fd"/> for <paramref name="events"/> (epoll(7) bits), reporting them for <paramref name="owner"/>.</summary>
    public abstract SysResult Register(int fd, object owner, uint events);

    /// <summary>
    /// Starts accepting on a listening <paramref name="fd"/> for <paramref name="owner"/>. Here: readiness, like
    /// <see cref="Register"/>, and the owner calls accept4. Where <see cref="AcceptsInKernel"/> is true the kernel
    /// accepts, and each event of the owner is one accepted socket, read with <see cref="AcceptedAt"/>.
    /// </summary>
    public virtual SysResult RegisterListener(int fd, object owner, uint events) => Register(fd, owner, events);

    /// <summary>True when a listener's events are accepted sockets (io_uring's multishot accept), not readiness.</summary>
    public virtual bool AcceptsInKernel => false;

    /// <summary>
    /// Where <see cref="AcceptsInKernel"/>: the socket the <paramref name="index"/>-th event of the last
    /// <see cref="Wait"/> accepted (the caller owns it), or -errno when the accept failed.
    /// </summary>
    public virtual int AcceptedAt(int index) => throw new NotSupportedException("This engine reports listener readiness, not accepted sockets.");

    /// <summary>Stops watching a registered fd (a listener backed off), remembering its owner for <see cref="Resume"/>.</summary>
    public abstract SysResult Pause(int fd);

    /// <summary>Watches a paused fd for <paramref name="events"/> again.</summary>
    public abstract SysResult Resume(int fd, uint events);

    /// <summary>
    /// Forgets <paramref name="fd"/> if <paramref name="owner"/> registered it. <paramref name="stillOpen"/> says the fd
    /// stays open (a listener another loop still polls), so the kernel must be told too; a closed fd drops out by itself.
    /// </summary>
    public abstract void Unregister(int fd, object owner, bool stillOpen);

    /// <summary>
    /// Forgets a connection's <paramref name="socket"/> that <paramref name="owner"/> registered, and closes it: here
    /// at once (closing is all epoll needs). An engine whose kernel requests hold the socket may take the fd over
    /// and close it once they have ended (io_uring, by the next <see cref="Wait"/>). Either way
    /// <paramref name="socket"/> reads as closed when this returns. Called under the send lock; never while the
    /// kernel may still read the socket's zero-copy sends (the connection waits for their notifications first).
    /// </summary>
    public virtual void Close(OwnedFd socket, object owner)
    {
        Unregister(socket.Value, owner, stillOpen: false);
        socket.Dispose();
    }

    /// <summary>
    /// Blocks until something is ready, <see cref="Signal"/> is called, or <paramref name="timeoutMs"/> passes (-1:
    /// no limit; 0: only looks). Returns how many events <see cref="OwnerAt"/> and <see cref="EventsAt"/> describe.
    /// </summary>
    public abstract int Wait(int timeoutMs);

    /// <summary>Who registered the fd of the <paramref name="index"/>-th event of the last <see cref="Wait"/>; null for the wake-up itself.</summary>
    public abstract object? OwnerAt(int index);

    /// <summary>The epoll(7) bits of the <paramref name="index"/>-th event of the last <see cref="Wait"/>.</summary>
    public abstract uint EventsAt(int index);

    /// <summary>
    /// What <see cref="EventsAt"/> reports for a zero-copy send's notification where <see cref="SendsZeroCopyAsOps"/>:
    /// the kernel is done with the send's memory (<see cref="ZeroCopyDoneAt"/> says which send). Not an epoll bit.
    /// </summary>
    public const uint ZeroCopyDone = 1u << 24;

    /// <summary>
    /// What <see cref="EventsAt"/> reports when the engine can no longer watch the owner's socket (io_uring: its poll
    /// failed, or could not be armed again): no event of the socket would reach the owner from now on, so the owner
    /// gives the socket up rather than wait for one. Not an epoll bit.
    /// </summary>
    public const uint RegistrationLost = 1u << 25;

    /// <summary>
    /// True when a zero-copy send in this loop's batches is an operation of the kernel's own (io_uring's
    /// SENDMSG_ZC) that carries a number (<see cref="NextZeroCopySend"/>), and its notification comes as a
    /// <see cref="ZeroCopyDone"/> event; false when it is <c>sendmsg(MSG_ZEROCOPY)</c>, notified on the socket's
    /// error queue (as a pool thread's own sends always are).
    /// </summary>
    public virtual bool SendsZeroCopyAsOps => false;

    /// <summary>Where <see cref="SendsZeroCopyAsOps"/>: a number for a zero-copy op of the next send batch (never 0).</summary>
    public virtual uint NextZeroCopySend() => throw new NotSupportedException("This engine's zero-copy sends carry no number.");

    /// <summary>The zero-copy op <paramref name="send"/> sent bytes: its <see cref="ZeroCopyDone"/> event goes to <paramref name="owner"/>.</summary>
    public virtual void AwaitZeroCopy(uint send, object owner) => throw new NotSupportedException("This engine's zero-copy sends carry no number.");

    /// <summary>For a <see cref="ZeroCopyDone"/> event: which send, and whether the kernel copied its bytes after all.</summary>
    public virtual (uint Send, bool Copied) ZeroCopyDoneAt(int index) => throw new NotSupportedException("This engine reports no zero-copy events.");

    /// <summary>Any thread: makes the current or next <see cref="Wait"/> return.</summary>
    public abstract void Signal();

    /// <summary>Performs every op of <paramref name="batch"/> and stores each one's result in it.</summary>
    public abstract void Execute(IoBatch batch, IoDirection direction);

    /// <summary>Busy polling for an idle <see cref="Wait"/> (BusyPollMicroseconds), where the backend has it.</summary>
    public abstract SysResult SetBusyPoll(uint microseconds);

    public abstract void Dispose();
}
