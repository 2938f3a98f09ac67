using System.Runtime.InteropServices;

namespace Kestrel.Transport.Linux.Interop;

/// <summary>
/// A file descriptor the transport must close exactly once: an epoll instance, an eventfd, a listening
/// socket, a connection's socket. Its owner disposes it; close(2) is called here and nowhere else.
/// </summary>
internal sealed partial class OwnedFd : IDisposable
{
    private int _fd;

    public OwnedFd(int fd)
    {
        ArgumentOutOfRangeException.ThrowIfNegative(fd);
        _fd = fd;
    }

    /// <summary>
    /// The number, or -1 once closed: a call made with it after that fails with EBADF instead of reaching
    /// whatever the kernel handed that number to next.
    /// </summary>
    public int Value => Volatile.Read(ref _fd);

    public bool IsClosed => Value < 0;

    /// <summary>Takes ownership of the fd a call returned, or throws the call's error.</summary>
    public static OwnedFd Take(SysResult result, string operation) => new(result.IntOrThrow(operation));

    /// <summary>Takes ownership of the fd a call returned; null when it failed.</summary>
    public static OwnedFd? TryTake(SysResult result) => result.IsError ? null : new OwnedFd((int)result.Value);

    /// <summary>Closes the fd once, whichever thread gets here first. EINTR is not retried: Linux releases the fd anyway (close(2), NOTES).</summary>
    public void Dispose()
    {
        int fd = Interlocked.Exchange(ref _fd, -1);
        if (fd >= 0)
        {
            _ = close(fd);
        }
    }

    /// <summary>
    /// Hands the fd to a new owner without closing it: from now on this one reads as closed (a call made with it
    /// fails with EBADF), and the returned one closes it. Null when it was already closed.
    /// </summary>
    public OwnedFd? Transfer()
    {
        int fd = Interlocked.Exchange(ref _fd, -1);
        return fd >= 0 ? new OwnedFd(fd) : null;
    }

    public override string ToString() => $"fd {Value}";

    [LibraryImport(LibC.Name, EntryPoint = "close")]
    private static partial int close(int fd);
}
