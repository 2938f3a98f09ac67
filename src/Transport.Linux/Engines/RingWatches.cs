using System.Runtime.InteropServices;
using Kestrel.Transport.Linux.Interop;

namespace Kestrel.Transport.Linux.Engines;

/// <summary>
/// <see cref="UringEngine"/>'s long-lived requests, one per watched fd, and their removal (the C# side of
/// ktl_uring_watch.c): a multishot poll per connection, a multishot accept per listener, who registered each fd,
/// and the sockets of connections closed in a pass, held open until their polls have ended. Loop thread only; the
/// engine owns the ring and outlives this.
/// </summary>
/// <remarks>
/// A request's completions carry its fd, a generation number and whether it is an accept. Every registration
/// takes a new generation, and forgetting an fd clears it, so a completion that was already queued for an fd's
/// previous registration (a closed connection whose number was reused, a paused listener) is recognised
/// (<see cref="IsCurrent"/>) and dropped by the engine; a socket such a stale accept brought is closed.
/// </remarks>
internal sealed unsafe class RingWatches(nint ring) : IDisposable
{
    private const uint GenerationMask = (1u << 29) - 1; // bits 61 to 63 of the user data are not the generation's

    // Zeroed by Dispose, before the engine destroys the ring: a late call then fails with EINVAL (ktl.h).
    private nint _ring = ring;

    // Per fd number: who registered it, its request's generation (0: none armed), its events and whether it is a
    // listener's accept, for re-arming.
    private object?[] _owners = new object?[1024];
    private bool[] _accepts = new bool[1024];
    private uint[] _generations = new uint[1024];
    private uint[] _pollEvents = new uint[1024];
    private uint _lastGeneration;

    // Connections closed this pass: their polls' user data and their fds, held open until the polls have ended.
    private readonly List<ulong> _closingRequests = [];
    private readonly List<OwnedFd> _closingSockets = [];

    /// <summary>Registers <paramref name="fd"/> for <paramref name="owner"/> and arms its poll, or its accept.</summary>
    public SysResult Watch(int fd, object owner, uint events, bool accept)
    {
        EnsureCapacity(fd);
        _owners[fd] = owner;
        _accepts[fd] = accept;
        return Arm(fd, events);
    }

    /// <summary>Arms a new request for a registered <paramref name="fd"/>, under a new generation.</summary>
    public SysResult Arm(int fd, uint events)
    {
        EnsureCapacity(fd);

        _lastGeneration = _lastGeneration == GenerationMask ? 1 : _lastGeneration + 1;
        _generations[fd] = _lastGeneration;
        _pollEvents[fd] = events;
        ulong userData = UserData(fd, _lastGeneration);
        int result = _accepts[fd]
            ? NativeEngine.ktl_ring_accept(_ring, fd, userData)
            : NativeEngine.ktl_ring_poll(_ring, fd, events, userData);
        if (result < 0)
        {
            _generations[fd] = 0;
        }

        return SysResult.FromNative(result);
    }

    /// <summary>Arms <paramref name="fd"/>'s request again, for the events it had: one that ended, or that the ring cancelled.</summary>
    public SysResult Rearm(int fd) => Arm(fd, _pollEvents[fd]);

    /// <summary>
    /// True when <paramref name="userData"/> is the request armed for its fd now (<paramref name="fd"/>); false for
    /// one that was removed, or that belonged to an earlier use of the fd number.
    /// </summary>
    public bool IsCurrent(ulong userData, out int fd)
    {
        fd = (int)(uint)userData;
        uint generation = (uint)(userData >> 32) & GenerationMask;
        return fd < _generations.Length && _generations[fd] == generation;
    }

    /// <summary>Who registered <paramref name="fd"/>.</summary>
    public object? OwnerOf(int fd) => _owners[fd];

    /// <summary><paramref name="fd"/>'s request has ended and is not armed again here: its later completions are stale.</summary>
    public void OnEnded(int fd) => _generations[fd] = 0;

    /// <summary>Removes <paramref name="fd"/>'s request without waiting for it to end, keeping its owner for <see cref="Arm"/>.</summary>
    public SysResult Pause(int fd)
    {
        if (fd >= _generations.Length || _generations[fd] == 0)
        {
            return SysResult.FromNative(-Errno.ENOENT);
        }

        ulong userData = UserData(fd, _generations[fd]);
        _generations[fd] = 0;
        return SysResult.FromNative(NativeEngine.ktl_ring_remove(_ring, userData, wait: 0));
    }

    /// <summary>Forgets <paramref name="fd"/> if <paramref name="owner"/> registered it, and removes its request.</summary>
    public void Unregister(int fd, object owner)
    {
        if (fd >= _owners.Length || !ReferenceEquals(_owners[fd], owner))
        {
            return;
        }

        _owners[fd] = null;
        uint generation = _generations[fd];
        _generations[fd] = 0;
        if (generation != 0)
        {
            // The request holds its own reference to the socket, so the removal goes to the kernel now and returns
            // once it has ended (usually one io_uring_enter): otherwise closing the fd would not release the
            // socket, a peer would see no FIN, and an unbound listener would go on filling its backlog. Sockets
            // accepted into its last completions are closed by the native side.
            _ = NativeEngine.ktl_ring_remove(_ring, UserData(fd, generation), wait: 1);
        }
    }

    /// <summary>
    /// The poll holds its own reference to the socket: closing the fd before the poll has ended would not release
    /// the socket, and a peer would see no FIN. So the fd is taken over, and <see cref="CloseClosing"/> (at the next
    /// wait) removes every poll closed in the pass with one <c>io_uring_enter</c> and then closes the fds.
    /// </summary>
    public void Close(OwnedFd socket, object owner)
    {
        int fd = socket.Value;
        if (fd < 0 || fd >= _owners.Length || !ReferenceEquals(_owners[fd], owner) || _generations[fd] == 0)
        {
            Unregister(fd, owner);
            socket.Dispose();
            return;
        }

        _closingRequests.Add(UserData(fd, _generations[fd]));
        _owners[fd] = null;
        _generations[fd] = 0;
        _closingSockets.Add(socket.Transfer()!);
    }

    /// <summary>Ends the polls of the sockets closed since the last wait, all in one <c>io_uring_enter</c>, and closes their fds.</summary>
    public void CloseClosing()
    {
        if (_closingSockets.Count == 0)
        {
            return;
        }

        var requests = CollectionsMarshal.AsSpan(_closingRequests);
        int removed;
        fixed (ulong* userData = requests)
        {
            removed = NativeEngine.ktl_ring_remove_all(_ring, userData, requests.Length);
        }

        foreach (var socket in _closingSockets)
        {
            // A removal that failed (no SQE to be had, or the ring is broken) may leave a poll holding its socket, which
            // closing the fd would not release until the ring is destroyed: shut it down first, so the peer still sees
            // the end (FIN after what was queued) now.
            if (removed < 0)
            {
                _ = Interop.Socket.Shutdown(socket.Value, Interop.Socket.SHUT_RDWR);
            }

            socket.Dispose();
        }

        _closingRequests.Clear();
        _closingSockets.Clear();
    }

    /// <summary>Closes the sockets still waiting for their polls to end, and lets go of the ring, which the engine destroys next.</summary>
    public void Dispose()
    {
        CloseClosing();
        _ring = 0;
    }

    private ulong UserData(int fd, uint generation)
        => ((ulong)generation << 32) | (uint)fd | (_accepts[fd] ? NativeEngine.RingAccept : 0);

    private void EnsureCapacity(int fd)
    {
        if (fd >= _owners.Length)
        {
            int size = Math.Max(fd + 1, _owners.Length * 2);
            Array.Resize(ref _owners, size);
            Array.Resize(ref _accepts, size);
            Array.Resize(ref _generations, size);
            Array.Resize(ref _pollEvents, size);
        }
    }
}
