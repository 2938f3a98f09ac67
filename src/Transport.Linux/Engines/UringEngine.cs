using System.Runtime.InteropServices;
using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Interop;

namespace Kestrel.Transport.Linux.Engines;

/// <summary>
/// The io_uring backend (<see cref="IoBackend.IoUring"/>): one ring per loop, in libktl_native.so. Each registered
/// connection has a multishot poll in the ring whose completions are its events (edges, as EPOLLET reports them);
/// each listener has a multishot accept, whose completions are accepted sockets (<see cref="AcceptedAt"/>); the
/// wake-up is a pending read of a blocking eventfd; a pass's receive or send batch is one <c>io_uring_enter</c>
/// that returns with every op's result, so pipe memory is never left with the kernel, except by a zero-copy send
/// (SENDMSG_ZC), whose blocks stay held until its notification (<see cref="IoEngine.ZeroCopyDone"/>).
/// <see cref="RingWatches"/> arms and removes the polls and accepts, <see cref="RingExecutor"/> runs the batches,
/// and this class turns the ring's completions into the loop's events.
/// </summary>
internal sealed unsafe class UringEngine : IoEngine
{
    /// <summary>Submission slots per ring; the completion queue is four times larger. A larger batch is submitted in parts.</summary>
    public const int RingEntries = 1024;

    /// <summary>Events one wait may return, as <see cref="EpollEngine.EventCapacity"/>.</summary>
    public const int EventCapacity = EpollEngine.EventCapacity;

    private const int Ecanceled = 125;

    private readonly OwnedFd _wake;
    private readonly RingCompletion* _events;
    private readonly object?[] _eventOwners = new object?[EventCapacity];
    private readonly uint[] _eventBits = new uint[EventCapacity];
    private readonly int[] _accepted = new int[EventCapacity];
    private readonly (uint Send, bool Copied)[] _zeroCopyDone = new (uint, bool)[EventCapacity];
    private readonly RingExecutor _executor;
    private readonly RingWatches _watches;
    private nint _ring;

    // Zero-copy sends that sent bytes, by number, and who hears of their notifications.
    private readonly Dictionary<uint, object> _zeroCopyOwners = [];
    private uint _lastZeroCopySend;
    private bool _disposed;
    private readonly bool _movable;

    private UringEngine(nint ring, RingInfo info, OwnedFd wake, bool movable)
    {
        _movable = movable;
        _ring = ring;
        _wake = wake;
        Info = info;
        _executor = new RingExecutor(ring);
        _watches = new RingWatches(ring);
        _events = (RingCompletion*)NativeMemory.Alloc((nuint)(EventCapacity * sizeof(RingCompletion)));
    }

    /// <summary>The ring's setup flags and the kernel's io_uring features; its abilities once <see cref="Start"/> has run.</summary>
    public RingInfo Info { get; private set; }

    public override IoBackend Backend => IoBackend.IoUring;

    public override string Name => $"io_uring ({SetupName(Info.Setup)}), native";

    public override bool IsNative => true;

    public override bool UsesAio => false;

    public override bool AcceptsInKernel => true;

    /// <summary>
    /// True for a ring created movable (Adaptive scheduling). Such a ring is set up without SINGLE_ISSUER|DEFER_TASKRUN
    /// (with them only the thread that enabled the ring may submit: EEXIST for any other) and has no fd registered with
    /// one thread. The completions of polls and accepts armed by a thread that has let go of the loop still reach the
    /// next holder; but when such a thread exits the kernel cancels them, so <see cref="Loop.LoopThreads"/> never
    /// retires a thread of a group with movable rings (docs/architecture.md, "Adaptive scheduling and io_uring").
    /// </summary>
    public override bool CanChangeThreads => _movable;

    public override bool SendsZeroCopyAsOps => (Info.Abilities & NativeEngine.RingSendsZeroCopy) != 0;

    /// <summary>
    /// Creates a ring (disabled until <see cref="Start"/> runs on the loop thread), or returns null with the positive
    /// errno of the failure and a description of the likely cause. <paramref name="movable"/>: see <see cref="CanChangeThreads"/>.
    /// </summary>
    public static UringEngine? TryCreate(out int error, out string? reason, bool movable = false)
    {
        reason = null;
        error = 0;
        if (!NativeEngine.IsSupported)
        {
            error = Errno.ENOSYS;
            reason = $"the io_uring engine is part of libktl_native.so, which is not in use ({NativeEngine.LoadError})";
            return null;
        }

        if (NativeEngine.ktl_ring_supported() == 0)
        {
            error = Errno.ENOSYS;
            reason = "this build of libktl_native.so has no io_uring engine: it was built without liburing-dev. Building from " +
                "source, install liburing-dev and build again";
            return null;
        }

        RingInfo info;
        int ringError;
        nint ring = NativeEngine.ktl_ring_create(RingEntries, movable ? NativeEngine.RingMovable : 0, &info, &ringError);
        if (ring == 0)
        {
            error = ringError;
            reason = IoUringTroubleshooting.Explain(ringError);
            return null;
        }

        // Blocking on purpose: the ring's read of it waits for a write (a non-blocking one would complete at once).
        var wake = EventFd.CreateBlocking();
        if (wake.IsError)
        {
            NativeEngine.ktl_ring_destroy(ring);
            error = wake.Error;
            reason = $"eventfd failed: {Errno.Describe(error)}";
            return null;
        }

        return new UringEngine(ring, info, OwnedFd.Take(wake, "eventfd"), movable);
    }

    /// <summary>The IORING_SETUP_* flags that matter here, as a log names them.</summary>
    public static string SetupName(uint setup) =>
        (setup & NativeEngine.SetupDeferTaskRun) != 0 ? "SINGLE_ISSUER|DEFER_TASKRUN"
        : (setup & NativeEngine.SetupCoopTaskRun) != 0 ? "COOP_TASKRUN"
        : "plain";

    public override void Start()
    {
        RingInfo info = Info;
        int result = NativeEngine.ktl_ring_start(_ring, _wake.Value, &info);
        if (result < 0)
        {
            throw Errno.ToException(-result, "io_uring: enabling the loop's ring");
        }

        Info = info;
    }

    public override SysResult Register(int fd, object owner, uint events) => _watches.Watch(fd, owner, events, accept: false);

    /// <summary>A multishot accept (Linux 5.19, which every ring this engine sets up has): no accept4, no EAGAIN at the end of a burst.</summary>
    public override SysResult RegisterListener(int fd, object owner, uint events) => _watches.Watch(fd, owner, events, accept: true);

    public override int AcceptedAt(int index) => _accepted[index];

    public override uint NextZeroCopySend() => _lastZeroCopySend = _lastZeroCopySend == uint.MaxValue ? 1 : _lastZeroCopySend + 1;

    public override void AwaitZeroCopy(uint send, object owner) => _zeroCopyOwners[send] = owner;

    public override (uint Send, bool Copied) ZeroCopyDoneAt(int index) => _zeroCopyDone[index];

    public override SysResult Pause(int fd) => _watches.Pause(fd);

    public override SysResult Resume(int fd, uint events) => _watches.Arm(fd, events);

    public override void Unregister(int fd, object owner, bool stillOpen) => _watches.Unregister(fd, owner);

    /// <summary>Takes the fd over until its poll has ended, at the next <see cref="Wait"/> (<see cref="RingWatches.Close"/>).</summary>
    public override void Close(OwnedFd socket, object owner) => _watches.Close(socket, owner);

    public override int Wait(int timeoutMs)
    {
        _watches.CloseClosing();
        int count = NativeEngine.ktl_ring_wait(_ring, timeoutMs, _events, EventCapacity);
        if (count < 0)
        {
            if (count == -Errno.EINTR)
            {
                return 0;
            }

            // ENOMEM or EBADR: a completion meant for the loop was lost (no memory to keep it, or the kernel
            // dropped it), so some connection may never hear from its poll again; ktl.h fails every later wait,
            // and the loop fails loudly (its connections reset) rather than leave one deaf without a word.
            throw Errno.ToException(-count, count is -Errno.ENOMEM or -Errno.EBADR
                ? "io_uring: the loop's ring lost a completion"
                : "io_uring_enter (the loop's wait)");
        }

        for (int i = 0; i < count; i++)
        {
            Resolve(i);
        }

        return count;
    }

    public override object? OwnerAt(int index) => _eventOwners[index];

    public override uint EventsAt(int index) => _eventBits[index];

    public override void Signal() => EventFd.Signal(_wake.Value);

    public override void Execute(IoBatch batch, IoDirection direction) => batch.Execute(_executor, direction);

    /// <summary>The epoll busy-poll parameters have no ring counterpart here (IORING_REGISTER_NAPI is not used).</summary>
    public override SysResult SetBusyPoll(uint microseconds) => SysResult.FromNative(-Errno.EOPNOTSUPP);

    public override void Dispose()
    {
        if (_disposed)
        {
            return;
        }

        _disposed = true;
        _watches.Dispose();
        nint ring = Interlocked.Exchange(ref _ring, 0);
        NativeEngine.ktl_ring_destroy(ring);
        _wake.Dispose();
        NativeMemory.Free(_events);
    }

    /// <summary>Turns the <paramref name="index"/>-th completion into an owner and its events, re-arming a poll that ended.</summary>
    private void Resolve(int index)
    {
        RingCompletion completion = _events[index];
        bool accept = (completion.UserData & NativeEngine.RingAccept) != 0;
        _eventOwners[index] = null;
        _eventBits[index] = 0;
        if ((completion.UserData & NativeEngine.RingSendDone) != 0)
        {
            // Every send that is notified is awaited: its connection holds the blocks until now, reset or not.
            uint send = (uint)completion.UserData;
            if (_zeroCopyOwners.Remove(send, out var owner))
            {
                _eventOwners[index] = owner;
                _eventBits[index] = ZeroCopyDone;
                _zeroCopyDone[index] = (send, completion.Result != 0);
            }

            return;
        }

        if (!_watches.IsCurrent(completion.UserData, out int fd))
        {
            // A request that was removed, or that belonged to an earlier use of this fd number; a socket it
            // accepted has nobody to go to.
            if (accept && completion.Result >= 0)
            {
                new OwnedFd(completion.Result).Dispose();
            }

            return;
        }

        bool armed = (completion.Flags & NativeEngine.CqeMore) != 0;
        if (accept)
        {
            ResolveAccept(index, fd, completion.Result, armed);
            return;
        }

        if (completion.Result >= 0)
        {
            _eventOwners[index] = _watches.OwnerOf(fd);
            _eventBits[index] = (uint)completion.Result;

            // A level-triggered registration's one-shot poll (re-armed, it reports the level again next pass if it
            // still holds), or a multishot poll the kernel ended because it could not post a completion.
            if (!armed && _watches.Rearm(fd).IsError)
            {
                _eventBits[index] = RegistrationLost;
            }
        }
        else if (completion.Result != -Ecanceled || _watches.Rearm(fd).IsError)
        {
            // The poll failed, or the ring cancelled it (RingWatches clears the generation before it removes one) and
            // it could not be armed again: the owner would never hear of its socket again, so it must give it up.
            _watches.OnEnded(fd);
            _eventOwners[index] = _watches.OwnerOf(fd);
            _eventBits[index] = RegistrationLost;
        }
    }

    /// <summary>
    /// An accept's completion: a socket, or the error that ended the multishot accept (io_uring ends it on any). One
    /// that ended with an error is not queued again here but by the acceptor (<see cref="Resume"/>), at once or after
    /// a backoff (EMFILE...): queued here, it would take the next client before the acceptor's pause removed it, and
    /// that client's socket would arrive for a removed accept and be closed. One that ended with a socket (a full
    /// completion queue) or that the ring cancelled is queued again at once; where that fails, the acceptor hears an
    /// accept error, and that one socket is closed.
    /// </summary>
    private void ResolveAccept(int index, int fd, int result, bool armed)
    {
        if (!armed && result < 0 && result != -Ecanceled)
        {
            _watches.OnEnded(fd);
        }
        else if (!armed)
        {
            var rearmed = _watches.Rearm(fd);
            if (rearmed.IsError)
            {
                if (result >= 0)
                {
                    new OwnedFd(result).Dispose();
                }

                result = -rearmed.Error;
            }
            else if (result == -Ecanceled)
            {
                return;
            }
        }

        _eventOwners[index] = _watches.OwnerOf(fd);
        _eventBits[index] = Epoll.EPOLLIN;
        _accepted[index] = result;
    }
}
