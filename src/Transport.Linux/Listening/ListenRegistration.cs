using Kestrel.Transport.Linux.Interop;
using Kestrel.Transport.Linux.Loop;

namespace Kestrel.Transport.Linux.Listening;

/// <summary>A listening fd as one loop sees it: what the loop polls it for, and its accept backoff.</summary>
internal sealed class ListenRegistration(LinuxConnectionListener listener, EventLoop loop, int fd, bool shared)
{
    private const int FirstBackoffMs = 10;
    private const int MaxBackoffMs = 1000;

    public LinuxConnectionListener Listener { get; } = listener;

    public EventLoop Loop { get; } = loop;

    public int Fd { get; } = fd;

    /// <summary>
    /// True when every loop polls this one fd (Unix sockets, inherited handles) with EPOLLEXCLUSIVE
    /// (Linux 4.5), so that one accept wakes one loop; false for a per-loop SO_REUSEPORT socket.
    /// </summary>
    public bool Shared { get; } = shared;

    /// <summary>What the loop polls the fd for: readable, and with EPOLLEXCLUSIVE when it is shared.</summary>
    public uint Events => Epoll.EPOLLIN | (Shared ? Epoll.EPOLLEXCLUSIVE : 0);

    public TaskCompletionSource Added { get; } = new(TaskCreationOptions.RunContinuationsAsynchronously);

    public TaskCompletionSource Removed { get; } = new(TaskCreationOptions.RunContinuationsAsynchronously);

    public long RetryAt { get; private set; }

    public int BackoffMs { get; private set; }

    /// <summary>After a failed accept (EMFILE...): wait, doubling up to a second, then poll again.</summary>
    public void BackOff()
    {
        BackoffMs = BackoffMs == 0 ? FirstBackoffMs : Math.Min(BackoffMs * 2, MaxBackoffMs);
        RetryAt = Environment.TickCount64 + BackoffMs;
    }

    public void ResetBackoff() => BackoffMs = 0;
}
