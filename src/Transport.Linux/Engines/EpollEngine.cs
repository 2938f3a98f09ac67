using System.Runtime.InteropServices;
using Kestrel.Transport.Linux.Interop;

namespace Kestrel.Transport.Linux.Engines;

/// <summary>
/// The epoll backends (<see cref="IoBackend.Epoll"/>, <see cref="IoBackend.EpollAio"/>): one epoll instance
/// for readiness, an eventfd for wake-ups, and a <see cref="BatchExecutor"/> for the batches, which does a
/// readv or sendmsg per socket, or one io_submit for the whole batch when it has an AIO context.
/// </summary>
internal sealed unsafe class EpollEngine : IoEngine
{
    /// <summary>Events one epoll_wait may return (a pass handles this many sockets at most; the rest come next pass).</summary>
    public const int EventCapacity = 256;

    /// <summary>
    /// The AIO context's size: a receive batch holds at most one op per event; the send batch may hold more (sends
    /// queued outside the wait), and ktl_batch submits a larger batch in chunks of this size.
    /// </summary>
    public const int AioCapacity = EventCapacity * 2;

    private readonly OwnedFd _epoll;
    private readonly OwnedFd _wake;
    private readonly BatchExecutor _executor;
    private readonly byte* _events;

    // Who registered each fd, indexed by fd number: one array read per event, no hashing.
    private object?[] _owners = new object?[1024];
    private bool _disposed;

    private EpollEngine(OwnedFd epoll, OwnedFd wake, BatchExecutor executor)
    {
        _epoll = epoll;
        _wake = wake;
        _executor = executor;
        _events = (byte*)NativeMemory.Alloc((nuint)(EventCapacity * Epoll.EventSize));
    }

    public override string Name => $"{(UsesAio ? "epoll+aio" : "epoll")}, {(IsNative ? "native" : "managed")}";

    public override IoBackend Backend => UsesAio ? IoBackend.EpollAio : IoBackend.Epoll;

    public override bool IsNative => _executor.IsNative;

    public override bool UsesAio => _executor.UsesAio;

    /// <summary>The epoll instance (tests read its registrations from /proc/self/fdinfo).</summary>
    public int EpollFd => _epoll.Value;

    /// <summary>
    /// Creates the engine for <paramref name="backend"/>. Where AIO was asked for but cannot be had (no native
    /// engine, or io_setup failed), the engine runs without it and <paramref name="aioUnavailable"/> says why.
    /// </summary>
    public static EpollEngine Create(IoBackend backend, bool preferNative, out string? aioUnavailable)
    {
        aioUnavailable = null;
        var epoll = OwnedFd.Take(Epoll.Create(), "epoll_create1");
        OwnedFd? wake = null;
        try
        {
            wake = OwnedFd.Take(EventFd.Create(), "eventfd");
            bool wantsAio = backend == IoBackend.EpollAio;
            var executor = BatchExecutor.Create(preferNative, wantsAio ? AioCapacity : 0, out int aioError);
            if (wantsAio && !executor.UsesAio)
            {
                aioUnavailable = aioError != 0
                    ? $"io_setup failed: {Errno.Describe(aioError)}; check fs.aio-max-nr"
                    : $"the managed engine has no AIO path ({NativeEngine.LoadError ?? "native engine disabled"})";
            }

            var engine = new EpollEngine(epoll, wake, executor);
            engine.Register(wake.Value, engine, Epoll.EPOLLIN).IntOrThrow("epoll_ctl(ADD) of the wake-up eventfd");
            return engine;
        }
        catch
        {
            wake?.Dispose();
            epoll.Dispose();
            throw;
        }
    }

    public override SysResult Register(int fd, object owner, uint events)
    {
        if (fd >= _owners.Length)
        {
            Array.Resize(ref _owners, Math.Max(fd + 1, _owners.Length * 2));
        }

        // A refused add (EEXIST: the fd is registered already) must leave the registration that holds the fd its owner.
        var previous = _owners[fd];
        _owners[fd] = owner;
        var result = Epoll.Control(_epoll.Value, Epoll.EPOLL_CTL_ADD, fd, events);
        if (result.IsError)
        {
            _owners[fd] = previous;
        }

        return result;
    }

    // Out of the epoll set and back in, rather than EPOLL_CTL_MOD to no events: MOD fails with EINVAL on an
    // EPOLLEXCLUSIVE registration (epoll_ctl(2)), which a shared listener has.
    public override SysResult Pause(int fd) => Epoll.Control(_epoll.Value, Epoll.EPOLL_CTL_DEL, fd, 0);

    public override SysResult Resume(int fd, uint events) => Epoll.Control(_epoll.Value, Epoll.EPOLL_CTL_ADD, fd, events);

    public override void Unregister(int fd, object owner, bool stillOpen)
    {
        if (fd < _owners.Length && ReferenceEquals(_owners[fd], owner))
        {
            _owners[fd] = null;
            if (stillOpen)
            {
                _ = Epoll.Control(_epoll.Value, Epoll.EPOLL_CTL_DEL, fd, 0);
            }
        }
    }

    public override int Wait(int timeoutMs)
    {
        var result = Epoll.Wait(_epoll.Value, _events, EventCapacity, timeoutMs);

        // EINTR (a signal, a debugger): the loop simply goes round again.
        return result.IsError ? 0 : (int)result.Value;
    }

    public override object? OwnerAt(int index)
    {
        int fd = Epoll.FdAt(_events, index);
        object? owner = fd < _owners.Length ? _owners[fd] : null;
        if (ReferenceEquals(owner, this))
        {
            // The wake-up: level-triggered, so it is read back to zero here, once per pass that saw it.
            EventFd.Drain(_wake.Value);
            return null;
        }

        return owner;
    }

    public override uint EventsAt(int index) => Epoll.EventsAt(_events, index);

    // After Dispose the fd reads -1: a late Signal fails with EBADF instead of writing into a reused number.
    public override void Signal() => EventFd.Signal(_wake.Value);

    public override void Execute(IoBatch batch, IoDirection direction) => batch.Execute(_executor, direction);

    public override SysResult SetBusyPoll(uint microseconds) => Epoll.SetBusyPollParameters(_epoll.Value, microseconds);

    public override void Dispose()
    {
        if (_disposed)
        {
            return;
        }

        _disposed = true;
        _wake.Dispose();
        _epoll.Dispose();
        _executor.Dispose();
        NativeMemory.Free(_events);
    }
}
