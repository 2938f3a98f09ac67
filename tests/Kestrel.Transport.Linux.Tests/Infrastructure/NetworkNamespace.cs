using System.Diagnostics;
using System.Runtime.InteropServices;
using Microsoft.Win32.SafeHandles;

namespace Kestrel.Transport.Linux.Tests.Infrastructure;

/// <summary>
/// A network namespace of the test's own, for what only a namespace can change without touching the
/// host: its sysctls (net.core.optmem_max is per namespace since Linux 6.9). unshare(CLONE_NEWNET)
/// moves only the calling thread, so <see cref="Run{T}"/> does it on a thread started for the purpose,
/// brings that namespace's loopback up and runs the body there. Sockets the body creates stay in the
/// namespace after the thread ends; so do the accepted sockets of a listener it bound.
/// <para>
/// A thread inherits the namespace of the thread that started it. The body must therefore create
/// sockets and nothing that could start a thread (no async continuation run inline, no thread-pool
/// work queued: a pool worker started there would put other tests' sockets in this namespace).
/// <see cref="ThreadsInside"/> lets the test check afterwards that no thread of the process is left in it.
/// </para>
/// </summary>
internal static unsafe partial class NetworkNamespace
{
    private const int CloneNewNet = 0x40000000;
    private const int AfInet = 2;
    private const int SockDgram = 2;
    private const nuint SiocGetInterfaceFlags = 0x8913;
    private const nuint SiocSetInterfaceFlags = 0x8914;
    private const short InterfaceUp = 0x1;

    /// <summary>The socket option memory limit, which bounds a socket's pending MSG_ZEROCOPY notifications.</summary>
    public const string OptmemMax = "/proc/sys/net/core/optmem_max";

    private static readonly Lazy<string?> s_unavailableReason = new(Probe);

    /// <summary>
    /// Null when this process may create a network namespace and set <see cref="OptmemMax"/> in it;
    /// otherwise why not (for a test's Skip).
    /// </summary>
    public static string? UnavailableReason => s_unavailableReason.Value;

    /// <summary>
    /// Runs <paramref name="body"/> on a new thread inside a new network namespace with loopback up;
    /// <paramref name="id"/> is the namespace's identity as /proc shows it ("net:[...]").
    /// </summary>
    public static T Run<T>(Func<T> body, out string id)
    {
        T result = default!;
        string? namespaceId = null;
        Exception? failure = null;
        var thread = new Thread(() =>
        {
            try
            {
                Enter();
                namespaceId = NamespaceOf("/proc/thread-self") ?? throw new InvalidOperationException("/proc/thread-self/ns/net is not a link.");
                result = body();
            }
            catch (Exception e)
            {
                failure = e;
            }
        })
        {
            IsBackground = true,
            Name = "test network namespace",
        };
        thread.Start();
        if (!thread.Join(TestTimeouts.Default))
        {
            throw new TimeoutException("The thread in the test's network namespace did not finish.");
        }

        if (failure is not null)
        {
            throw new InvalidOperationException($"In the test's network namespace: {failure.Message}", failure);
        }

        id = namespaceId!;
        return result;
    }

    /// <summary>
    /// In the body of <see cref="Run{T}"/>: a handle on its namespace, which keeps the namespace alive and lets
    /// <see cref="Execute"/> run commands in it from any thread.
    /// </summary>
    public static SafeFileHandle Open() => File.OpenHandle("/proc/thread-self/ns/net", FileMode.Open, FileAccess.Read, FileShare.ReadWrite);

    /// <summary>
    /// Runs <paramref name="command"/> (tc, say) inside the namespace <paramref name="handle"/> holds, through
    /// <c>nsenter --net</c> (util-linux); returns what it printed, and fails with its output when it does not succeed.
    /// </summary>
    public static string Execute(SafeFileHandle handle, params string[] command)
    {
        var start = new ProcessStartInfo("nsenter")
        {
            RedirectStandardOutput = true,
            RedirectStandardError = true,
            UseShellExecute = false,
        };
        start.ArgumentList.Add($"--net=/proc/{Environment.ProcessId}/fd/{handle.DangerousGetHandle()}");
        start.ArgumentList.Add("--");
        foreach (string argument in command)
        {
            start.ArgumentList.Add(argument);
        }

        using var process = Process.Start(start)!;
        string stdout = process.StandardOutput.ReadToEnd();
        string stderr = process.StandardError.ReadToEnd();
        if (!process.WaitForExit(TestTimeouts.Default) || process.ExitCode != 0)
        {
            throw new InvalidOperationException(
                $"'nsenter ... {string.Join(' ', command)}' failed in the test's network namespace: {stdout}{stderr}".TrimEnd());
        }

        return stdout;
    }

    /// <summary>The process's threads that are in the namespace <paramref name="id"/>, by name.</summary>
    public static List<string> ThreadsInside(string id)
    {
        var inside = new List<string>();
        foreach (var task in Directory.EnumerateDirectories("/proc/self/task"))
        {
            try
            {
                if (NamespaceOf(task) == id)
                {
                    inside.Add($"{Path.GetFileName(task)} ({File.ReadAllText(Path.Combine(task, "comm")).Trim()})");
                }
            }
            catch (IOException)
            {
                // The thread ended while we looked.
            }
        }

        return inside;
    }

    /// <summary>The network namespace of the thread whose /proc directory is <paramref name="task"/>, as "net:[...]".</summary>
    private static string? NamespaceOf(string task) => new FileInfo(Path.Combine(task, "ns", "net")).LinkTarget;

    /// <summary>On the calling thread: a new network namespace, its loopback up.</summary>
    private static void Enter()
    {
        if (Unshare(CloneNewNet) != 0)
        {
            throw new InvalidOperationException($"unshare(CLONE_NEWNET) failed: errno {Marshal.GetLastPInvokeError()} (it needs CAP_SYS_ADMIN).");
        }

        int fd = Socket(AfInet, SockDgram, 0);
        if (fd < 0)
        {
            throw new InvalidOperationException($"socket() failed in the new namespace: errno {Marshal.GetLastPInvokeError()}.");
        }

        try
        {
            var request = default(InterfaceRequest);
            "lo"u8.CopyTo(new Span<byte>(request.Name, 16));
            if (Ioctl(fd, SiocGetInterfaceFlags, &request) != 0)
            {
                throw new InvalidOperationException($"SIOCGIFFLAGS on lo failed: errno {Marshal.GetLastPInvokeError()}.");
            }

            request.Flags |= InterfaceUp;
            if (Ioctl(fd, SiocSetInterfaceFlags, &request) != 0)
            {
                throw new InvalidOperationException($"SIOCSIFFLAGS (lo up) failed: errno {Marshal.GetLastPInvokeError()}.");
            }
        }
        finally
        {
            _ = Close(fd);
        }
    }

    private static string? Probe()
    {
        try
        {
            return Run(() => File.Exists(OptmemMax), out _)
                ? null
                : "net.core.optmem_max is not per network namespace on this kernel (Linux 6.9 made it so).";
        }
        catch (InvalidOperationException e)
        {
            return $"This process cannot create a network namespace: {e.Message}";
        }
    }

    // struct ifreq (linux/if.h): the interface's name, then a union whose ifr_flags is a short.
    [StructLayout(LayoutKind.Sequential, Size = 40)]
    private struct InterfaceRequest
    {
        public fixed byte Name[16];
        public short Flags;
    }

    [LibraryImport("libc", EntryPoint = "unshare", SetLastError = true)]
    private static partial int Unshare(int flags);

    [LibraryImport("libc", EntryPoint = "socket", SetLastError = true)]
    private static partial int Socket(int domain, int type, int protocol);

    [LibraryImport("libc", EntryPoint = "ioctl", SetLastError = true)]
    private static partial int Ioctl(int fd, nuint request, InterfaceRequest* argument);

    [LibraryImport("libc", EntryPoint = "close")]
    private static partial int Close(int fd);
}
