using System.Net.Sockets;
using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Interop;

namespace Kestrel.Transport.Linux.Tests.Diagnostics;

/// <summary>The start-up probe reports what the kernel really allows, checked here by independent means.</summary>
public sealed class KernelFeaturesTests
{
    [Fact]
    public void The_probe_agrees_with_the_kernel()
    {
        var features = KernelFeatures.For(new LinuxTransportOptions { IoBackend = IoBackend.EpollAio });
        var sockets = features.Sockets;
        var release = Environment.OSVersion.Version;

        Assert.Equal(NativeEngine.IsSupported, features.NativeEngine);

        // SO_REUSEPORT: set through System.Net.Sockets, which knows nothing of our interop.
        using (var socket = new System.Net.Sockets.Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp))
        {
            bool expected = true;
            try
            {
                socket.SetRawSocketOption(1 /* SOL_SOCKET */, 15 /* SO_REUSEPORT */, BitConverter.GetBytes(1));
            }
            catch (SocketException)
            {
                expected = false;
            }

            Assert.Equal(expected, sockets.ReusePort);
        }

        // Kernel versions from CONTEXT.md: EPOLLEXCLUSIVE 4.5, MSG_ZEROCOPY 4.14, epoll busy-poll parameters 6.9.
        Assert.Equal(release >= new Version(4, 5), sockets.EpollExclusive);
        Assert.Equal(release >= new Version(6, 9), sockets.EpollBusyPollParameters);
        if (release >= new Version(4, 14))
        {
            Assert.True(sockets.ZeroCopy);
        }

        // AIO: available exactly when the native engine is and io_setup has room (fs.aio-max-nr).
        if (!features.NativeEngine)
        {
            Assert.Equal(-1, features.AioError);
        }
        else if (int.Parse(File.ReadAllText("/proc/sys/fs/aio-max-nr").Trim(), System.Globalization.CultureInfo.InvariantCulture) > 0)
        {
            Assert.True(features.AioError == 0, features.ToString());
        }
    }

    /// <summary>
    /// Each backend probes what it may use and nothing else (the seccomp test in TechEmpower.Tests/IoUring shows the
    /// default making neither call): AIO only for EpollAio, io_uring only where the backend may run on it.
    /// </summary>
    [Theory]
    [InlineData(IoBackend.Epoll, ApplicationSchedulingMode.ThreadPool, false, false)]
    [InlineData(IoBackend.Epoll, ApplicationSchedulingMode.Inline, false, false)]
    [InlineData(IoBackend.EpollAio, ApplicationSchedulingMode.ThreadPool, true, false)]
    [InlineData(IoBackend.Auto, ApplicationSchedulingMode.ThreadPool, false, false)]
    [InlineData(IoBackend.Auto, ApplicationSchedulingMode.Adaptive, false, false)]
    [InlineData(IoBackend.Auto, ApplicationSchedulingMode.Inline, false, true)]
    [InlineData(IoBackend.IoUring, ApplicationSchedulingMode.ThreadPool, false, true)]
    public void Only_what_the_backend_may_use_is_probed(IoBackend backend, ApplicationSchedulingMode scheduling, bool aio, bool ring)
    {
        var features = KernelFeatures.For(new LinuxTransportOptions { IoBackend = backend, ApplicationSchedulingMode = scheduling });

        Assert.Equal(aio, features.AioError is not null);
        Assert.Equal(ring, features.Ring is not null);
        Assert.Equal(!aio, features.ToString().Contains("Linux AIO not probed", StringComparison.Ordinal));
        Assert.Equal(!ring, features.ToString().Contains("io_uring not probed", StringComparison.Ordinal));
    }

    [Fact]
    public void Invariants_the_interop_relies_on_hold()
    {
        // The flags that share values with O_CLOEXEC and O_NONBLOCK (see epoll_create1(2), eventfd(2), socket(2)).
        Assert.Equal(LibC.O_CLOEXEC, Epoll.EPOLL_CLOEXEC);
        Assert.Equal(LibC.O_CLOEXEC, EventFd.EFD_CLOEXEC);
        Assert.Equal(LibC.O_CLOEXEC, Interop.Socket.SOCK_CLOEXEC);
        Assert.Equal(LibC.O_NONBLOCK, EventFd.EFD_NONBLOCK);
        Assert.Equal(LibC.O_NONBLOCK, Interop.Socket.SOCK_NONBLOCK);

        // ktl_op is 32 bytes on LP64 (src/Native/include/ktl.h), flags at 24.
        Assert.Equal(32, System.Runtime.CompilerServices.Unsafe.SizeOf<IoOp>());
        Assert.Equal(24, (int)System.Runtime.InteropServices.Marshal.OffsetOf<IoOp>(nameof(IoOp.Flags)));
        Assert.Equal(IntPtr.Size * 2, System.Runtime.CompilerServices.Unsafe.SizeOf<Iovec>());
    }
}
