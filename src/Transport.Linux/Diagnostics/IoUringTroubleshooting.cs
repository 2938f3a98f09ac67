using System.Runtime.InteropServices;
using Kestrel.Transport.Linux.Interop;

namespace Kestrel.Transport.Linux.Diagnostics;

/// <summary>
/// Turns a failed io_uring_setup into what an operator needs: the errno and its likely cause on this host.
/// docs/troubleshooting.md has the remedies.
/// </summary>
internal static class IoUringTroubleshooting
{
    private const string DisabledSysctl = "/proc/sys/kernel/io_uring_disabled";

    /// <summary>
    /// What one loop's ring (<see cref="Engines.UringEngine.RingEntries"/> submission entries, four times as many
    /// completion entries) locks against RLIMIT_MEMLOCK where it counts: 34 pages, measured on Linux 6.18 by
    /// creating rings under setpriv --bounding-set=-ipc_lock and prlimit --memlock (one fits in 136 KiB, not in
    /// 128 KiB; two in 272 KiB, not in 256 KiB; seven in 1 MiB): 64 KiB of 64-byte SQEs, 64 KiB of 16-byte CQEs, and
    /// the rings' headers and index array. A ring's charge is returned only after its teardown, which the kernel
    /// finishes asynchronously, hence one ring more than the loops (the start-up probe's).
    /// </summary>
    public const int RingLockedKib = 136;

    public static string Explain(int errno)
    {
        string failure = $"io_uring_setup failed: {Errno.Describe(errno)}";
        string? cause = errno switch
        {
            Errno.EPERM => "a seccomp profile that blocks io_uring (Docker's and containerd's default profiles do)" +
                $", or kernel.io_uring_disabled ({DisabledSetting()}: 2 disables io_uring, 1 allows it only to kernel.io_uring_group)",
            Errno.ENOSYS => "a seccomp profile that answers io_uring with ENOSYS, a kernel built without CONFIG_IO_URING, " +
                "or an emulator without io_uring (qemu-user)",
            Errno.ENOMEM => $"RLIMIT_MEMLOCK ({LockedMemoryLimit()}) too low for the rings: in a process without CAP_IPC_LOCK " +
                $"(as in most containers) each loop's ring locks {RingLockedKib} KiB against it, and the limit is shared by " +
                "all of the user's processes; allow (loops + 1) rings, plus what zero-copy sends pin " +
                "(`ulimit -l`, LimitMEMLOCK= in systemd, --ulimit memlock in Docker), or memory is exhausted",
            Errno.EINVAL => $"the kernel ({RuntimeInformation.OSDescription}) is older than 5.19, whose ring setup flags the engine needs",
            Errno.EMFILE or Errno.ENFILE => "the open-file limit (the ring takes one fd per loop)",
            _ => null,
        };
        return cause is null ? failure : $"{failure}; likely cause: {cause}";
    }

    /// <summary>The soft RLIMIT_MEMLOCK of this process as /proc/self/limits shows it.</summary>
    private static string LockedMemoryLimit()
    {
        try
        {
            foreach (string line in File.ReadLines("/proc/self/limits"))
            {
                if (line.StartsWith("Max locked memory", StringComparison.Ordinal))
                {
                    string soft = line["Max locked memory".Length..].Trim().Split(' ', StringSplitOptions.RemoveEmptyEntries)[0];
                    return long.TryParse(soft, System.Globalization.NumberStyles.None, System.Globalization.CultureInfo.InvariantCulture, out long bytes)
                        ? $"{bytes / 1024} KiB here"
                        : $"{soft} here";
                }
            }
        }
        catch (IOException)
        {
        }
        catch (UnauthorizedAccessException)
        {
        }

        return "unknown here";
    }

    private static string DisabledSetting()
    {
        try
        {
            return File.Exists(DisabledSysctl) ? $"now {File.ReadAllText(DisabledSysctl).Trim()}" : "absent before Linux 6.6";
        }
        catch (IOException)
        {
            return "unreadable";
        }
        catch (UnauthorizedAccessException)
        {
            return "unreadable";
        }
    }
}
