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
        var features = KernelFeatures.Current;
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

            Assert.Equal(expected, features.ReusePort);
        }

        // Kernel versions from CONTEXT.md: EPOLLEXCLUSIVE 4.5, MSG_ZEROCOPY 4.14, epoll busy-poll parameters 6.9.
        Assert.Equal(release >= new Version(4, 5), features.EpollExclusive);
        Assert.Equal(release >= new Version(6, 9), features.EpollBusyPollParameters);
        if (release >= new Version(4, 14))
        {
            Assert.True(features.ZeroCopy);
        }

        // AIO: available exactly when the native engine is and io_setup has room (fs.aio-max-nr).
        if (!features.NativeEngine)
        {
            Assert.False(features.Aio);
        }
        else if (int.Parse(File.ReadAllText("/proc/sys/fs/aio-max-nr").Trim(), System.Globalization.CultureInfo.InvariantCulture) > 0)
        {
            Assert.True(features.Aio, features.ToString());
        }
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
