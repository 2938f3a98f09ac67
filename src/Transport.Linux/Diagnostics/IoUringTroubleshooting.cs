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

    public static string Explain(int errno)
    {
        string failure = $"io_uring_setup failed: {Errno.Describe(errno)}";
        string? cause = errno switch
        {
            Errno.EPERM => "a seccomp profile that blocks io_uring (Docker's and containerd's default profiles do)" +
                $", or kernel.io_uring_disabled ({DisabledSetting()}: 2 disables io_uring, 1 allows it only to kernel.io_uring_group)",
            Errno.ENOSYS => "a seccomp profile that answers io_uring with ENOSYS, a kernel built without CONFIG_IO_URING, " +
                "or an emulator without io_uring (qemu-user)",
            Errno.ENOMEM => "RLIMIT_MEMLOCK too low for the ring (kernels before 5.12 charge ring memory to it: raise `ulimit -l`, " +
                "LimitMEMLOCK= in systemd, --ulimit memlock in Docker), or memory exhausted",
            Errno.EINVAL => $"the kernel ({RuntimeInformation.OSDescription}) is older than 5.19, whose ring setup flags the engine needs",
            Errno.EMFILE or Errno.ENFILE => "the open-file limit (the ring takes one fd per loop)",
            _ => null,
        };
        return cause is null ? failure : $"{failure}; likely cause: {cause}";
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
