using System.Runtime.InteropServices;

namespace Kestrel.Transport.Linux.Microbenchmarks.BatchIo;

/// <summary>The libc calls the batch suite makes outside the measured code: set up, fill and drain socket pairs.</summary>
internal static unsafe partial class SocketCalls
{
    public const int AF_UNIX = 1;
    public const int SOCK_STREAM = 1;
    public const int SOCK_NONBLOCK = 0x800;   // == O_NONBLOCK, socket(2)
    public const int SOCK_CLOEXEC = 0x80000;  // == O_CLOEXEC
    public const int F_GETFL = 3;
    public const int F_SETFL = 4;
    public const int O_NONBLOCK = 0x800;
    public const int EAGAIN = 11;
    public const int EINTR = 4;

    [LibraryImport("libc", EntryPoint = "socketpair", SetLastError = true)]
    private static partial int socketpair(int domain, int type, int protocol, int* fds);

    [LibraryImport("libc", EntryPoint = "read", SetLastError = true)]
    private static partial nint read(int fd, void* buffer, nuint count);

    [LibraryImport("libc", EntryPoint = "write", SetLastError = true)]
    private static partial nint write(int fd, void* buffer, nuint count);

    [LibraryImport("libc", EntryPoint = "fcntl", SetLastError = true)]
    private static partial int fcntl(int fd, int cmd, int arg);

    [LibraryImport("libc", EntryPoint = "close", SetLastError = true)]
    public static partial int Close(int fd);

    /// <summary>socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC): two connected non-blocking ends.</summary>
    public static (int First, int Second) CreateUnixStreamPair()
    {
        int* fds = stackalloc int[2];
        ThrowIfFailed(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), "socketpair");
        return (fds[0], fds[1]);
    }

    public static void SetNonBlocking(int fd)
    {
        int flags = ThrowIfFailed(fcntl(fd, F_GETFL, 0), "fcntl(F_GETFL)");
        ThrowIfFailed(fcntl(fd, F_SETFL, flags | O_NONBLOCK), "fcntl(F_SETFL)");
    }

    /// <summary>Writes all of <paramref name="data"/>; the socket buffer is sized so that it never has to wait.</summary>
    public static void WriteAll(int fd, ReadOnlySpan<byte> data)
    {
        fixed (byte* p = data)
        {
            int done = 0;
            while (done < data.Length)
            {
                nint n = write(fd, p + done, (nuint)(data.Length - done));
                if (n < 0)
                {
                    int errno = Marshal.GetLastPInvokeError();
                    if (errno == EINTR)
                    {
                        continue;
                    }

                    throw new IOException($"write(fd {fd}) stopped after {done} of {data.Length} bytes: {Marshal.GetPInvokeErrorMessage(errno)}");
                }

                done += (int)n;
            }
        }
    }

    /// <summary>Reads until EAGAIN and returns the byte count: whatever an earlier iteration left behind.</summary>
    public static long Drain(int fd, Span<byte> scratch)
    {
        long total = 0;
        fixed (byte* p = scratch)
        {
            while (true)
            {
                nint n = read(fd, p, (nuint)scratch.Length);
                if (n > 0)
                {
                    total += n;
                    continue;
                }

                int errno = n < 0 ? Marshal.GetLastPInvokeError() : 0;
                if (errno == EINTR)
                {
                    continue;
                }

                if (n == 0 || errno != EAGAIN)
                {
                    throw new IOException($"read(fd {fd}) while draining: {(n == 0 ? "EOF" : Marshal.GetPInvokeErrorMessage(errno))}");
                }

                return total;
            }
        }
    }

    private static int ThrowIfFailed(int result, string call)
        => result >= 0 ? result : throw new IOException($"{call}: {Marshal.GetPInvokeErrorMessage(Marshal.GetLastPInvokeError())}");
}
