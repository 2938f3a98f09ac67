using System.Runtime.InteropServices;
using System.Text;
using Kestrel.Transport.Linux.Reliability.Tests.Infrastructure;

namespace Kestrel.Transport.Linux.Reliability.Tests.PortsAndFiles;

/// <summary>What a server does with whatever already exists at its Unix socket's path.</summary>
public sealed partial class UnixSocketPathTests(ITestOutputHelper output) : IDisposable
{
    private const int AtCurrentDirectory = -100;
    private const uint StatxInode = 0x100;

    private readonly DirectoryInfo _directory = Directory.CreateTempSubdirectory("ktl-rel-uds-");

    public static TheoryData<TransportKind> Kinds => new() { TransportKind.Sockets, TransportKind.LinuxNative };

    public static TheoryData<TransportKind, TransportKind> Pairs =>
        new()
        {
            { TransportKind.Sockets, TransportKind.Sockets },
            { TransportKind.LinuxNative, TransportKind.LinuxNative },
            { TransportKind.LinuxIoUring, TransportKind.LinuxIoUring },
            { TransportKind.LinuxNative, TransportKind.Sockets },
            { TransportKind.Sockets, TransportKind.LinuxNative },
        };

    private string SocketPath => Path.Combine(_directory.FullName, "kestrel.sock");

    /// <summary>
    /// A second server on the path of a live server's socket fails to start, and the live server keeps its socket
    /// file and every connection: the second must not have unlinked and re-created the path.
    /// </summary>
    [Theory]
    [MemberData(nameof(Pairs))]
    public async Task A_live_servers_socket_path_is_refused_and_the_live_server_keeps_serving(TransportKind first, TransportKind second)
    {
        await using var live = await NamedServer.StartAsync(first, "live", output, k => k.ListenUnixSocket(SocketPath));

        var failure = await Assert.ThrowsAnyAsync<Exception>(() => NamedServer.StartAsync(second, "second", output, k => k.ListenUnixSocket(SocketPath)));
        output.WriteLine($"{second} on {first}'s live socket: {failure.GetType().Name}: {failure.Message} <- {failure.InnerException?.GetType().Name}: {failure.InnerException?.Message}");

        // Had the second server unlinked the path, the live server's socket would be unreachable by name.
        for (var i = 0; i < 8; i++)
        {
            Assert.Equal("live", await NamedServer.AskAsync(NamedServer.Unix(SocketPath)));
        }
    }

    /// <summary>
    /// A socket file left by a server that died (nobody listening on it). The Linux transport probes it with a
    /// connect, finds nobody, replaces it and serves. Kestrel's Sockets transport does not: its bind fails with
    /// "address already in use" (run here as the reference, it proves the stale file really blocks a plain bind,
    /// so the Linux run shows a deliberate difference rather than an empty setup).
    /// </summary>
    [Theory]
    [MemberData(nameof(Kinds))]
    public async Task A_stale_socket_file_is_replaced_by_the_Linux_transport_where_Sockets_fails(TransportKind kind)
    {
        CreateStaleSocketFile(SocketPath);
        var staleInode = Inode(SocketPath);
        Assert.True(await TestSockets.IsRefusedAsync(new System.Net.Sockets.UnixDomainSocketEndPoint(SocketPath)), "The stale socket file accepted a connection: the setup left a listener behind.");

        if (!kind.IsLinux())
        {
            var failure = await Assert.ThrowsAsync<IOException>(() => NamedServer.StartAsync(kind, "new", output, k => k.ListenUnixSocket(SocketPath)));
            output.WriteLine($"{kind}: {failure.Message}");
            Assert.Equal(staleInode, Inode(SocketPath));
            return;
        }

        await using var server = await NamedServer.StartAsync(kind, "new", output, k => k.ListenUnixSocket(SocketPath));

        // The stale file refused every connect (nobody listened on it), so an answer from "new" proves the
        // path now names the new server's socket. (Not the inode number: tmpfs hands a freed one straight
        // back to the next file, so the replacement may well carry the stale file's number.)
        Assert.Equal("new", await NamedServer.AskAsync(NamedServer.Unix(SocketPath)));
    }

    /// <summary>
    /// The probe that decides whether a socket file is stale cannot even be made: the process is out of file
    /// descriptors (EMFILE), so its probe socket cannot be created. That says nothing about the file, so the bind
    /// fails with an error naming the path, and the live server that owns the file keeps its name.
    /// </summary>
    [Theory]
    [MemberData(nameof(Kinds))]
    public async Task A_probe_that_cannot_be_made_leaves_a_live_servers_socket_file_alone(TransportKind kind)
    {
        await using var live = await NamedServer.StartAsync(TransportKind.Sockets, "live", output, k => k.ListenUnixSocket(SocketPath));
        await using var transport = TestTransport.Create(kind, output);

        // Start the transport's loops first (their epoll and eventfd descriptors), so that the only descriptor
        // the contested bind needs before it can decide anything is the probe's.
        await transport.BindAsync(new System.Net.IPEndPoint(System.Net.IPAddress.Loopback, 0));

        // The kernel hands out the lowest free number (open(2)): with the soft limit there, every lower number is
        // taken and the next descriptor fails with EMFILE. This suite runs one test at a time, and the window is
        // one bind long.
        var (soft, _) = FileDescriptorLimit.Get();
        var open = ProcessResources.OpenFileDescriptors().Keys.ToHashSet();
        int lowestFree = Enumerable.Range(0, open.Count + 1).First(fd => !open.Contains(fd));
        Exception? failure;
        FileDescriptorLimit.SetSoft((ulong)lowestFree);
        try
        {
            failure = await Record.ExceptionAsync(() => transport.BindAsync(NamedServer.Unix(SocketPath)));
        }
        finally
        {
            FileDescriptorLimit.SetSoft(soft);
        }

        Assert.NotNull(failure);
        output.WriteLine($"{kind} out of descriptors: {failure.GetType().Name}: {failure.Message}");
        if (kind.IsLinux())
        {
            // Sockets' own error is the bare errno; the Linux transport says which path, and why it gave up.
            Assert.Contains(SocketPath, failure.Message, StringComparison.Ordinal);
        }

        for (var i = 0; i < 4; i++)
        {
            Assert.Equal("live", await NamedServer.AskAsync(NamedServer.Unix(SocketPath)));
        }
    }

    /// <summary>
    /// A live socket of another type (a datagram socket) owns the path: a stream connect to it fails with
    /// EPROTOTYPE, not ECONNREFUSED, so nothing proves the file stale. The bind fails and the datagram socket still
    /// receives what is sent to its path (Sockets fails its bind too, as for any existing file).
    /// </summary>
    [Theory]
    [MemberData(nameof(Kinds))]
    public async Task A_live_datagram_socket_at_the_path_fails_the_bind_and_keeps_its_name(TransportKind kind)
    {
        using var owner = new System.Net.Sockets.Socket(System.Net.Sockets.AddressFamily.Unix, System.Net.Sockets.SocketType.Dgram, System.Net.Sockets.ProtocolType.Unspecified);
        owner.Bind(NamedServer.Unix(SocketPath));

        var failure = await Assert.ThrowsAnyAsync<Exception>(() => NamedServer.StartAsync(kind, "server", output, k => k.ListenUnixSocket(SocketPath)));
        output.WriteLine($"{kind}: {failure.GetType().Name}: {failure.Message} <- {failure.InnerException?.GetType().Name}: {failure.InnerException?.Message}");

        using var sender = new System.Net.Sockets.Socket(System.Net.Sockets.AddressFamily.Unix, System.Net.Sockets.SocketType.Dgram, System.Net.Sockets.ProtocolType.Unspecified);
        var datagram = Encoding.ASCII.GetBytes($"still mine {Guid.NewGuid()}");
        await sender.SendToAsync(datagram, NamedServer.Unix(SocketPath));
        var received = new byte[256];
        using var cts = new CancellationTokenSource(TestTimeouts.Default);
        int length = await owner.ReceiveAsync(received, System.Net.Sockets.SocketFlags.None, cts.Token);
        Assert.Equal(datagram, received[..length]);
    }

    /// <summary>A regular file at the path makes the bind fail, and the file is neither deleted nor changed.</summary>
    [Theory]
    [MemberData(nameof(Kinds))]
    public async Task A_regular_file_at_the_path_fails_the_bind_and_is_left_unchanged(TransportKind kind)
    {
        var content = Encoding.UTF8.GetBytes($"precious data {Guid.NewGuid()}");
        await File.WriteAllBytesAsync(SocketPath, content);

        var failure = await Assert.ThrowsAnyAsync<Exception>(() => NamedServer.StartAsync(kind, "server", output, k => k.ListenUnixSocket(SocketPath)));
        output.WriteLine($"{kind}: {failure.GetType().Name}: {failure.Message} <- {failure.InnerException?.GetType().Name}: {failure.InnerException?.Message}");

        Assert.True(File.Exists(SocketPath), "The regular file at the socket path was deleted.");
        Assert.Equal(content, await File.ReadAllBytesAsync(SocketPath));
    }

    /// <summary>A directory at the path makes the bind fail with an error that names the path; the directory stays.</summary>
    [Theory]
    [MemberData(nameof(Kinds))]
    public async Task A_directory_at_the_path_fails_with_an_error_naming_the_path(TransportKind kind)
    {
        Directory.CreateDirectory(SocketPath);
        File.WriteAllText(Path.Combine(SocketPath, "inside.txt"), "keep");

        var failure = await Assert.ThrowsAnyAsync<Exception>(() => NamedServer.StartAsync(kind, "server", output, k => k.ListenUnixSocket(SocketPath)));
        var messages = $"{failure.Message} <- {failure.InnerException?.Message}";
        output.WriteLine($"{kind}: {failure.GetType().Name}: {messages}");
        Assert.Contains(SocketPath, messages, StringComparison.Ordinal);
        Assert.True(Directory.Exists(SocketPath) && File.Exists(Path.Combine(SocketPath, "inside.txt")), "The directory at the socket path was removed or emptied.");
    }

    public void Dispose() => _directory.Delete(recursive: true);

    /// <summary>The inode identifies the file object: a path unlinked and re-created gets a new one.</summary>
    private static ulong Inode(string path)
    {
        var result = default(StatxResult);
        Assert.True(Statx(AtCurrentDirectory, path, 0, StatxInode, ref result) == 0, $"statx({path}) failed: errno {Marshal.GetLastPInvokeError()}");
        return result.Ino;
    }

    /// <summary>Binds a socket to <paramref name="path"/> with libc and closes it without unlinking: what a killed server leaves.</summary>
    private static unsafe void CreateStaleSocketFile(string path)
    {
        const int AF_UNIX = 1;
        const int SOCK_STREAM = 1;
        var fd = Socket(AF_UNIX, SOCK_STREAM, 0);
        Assert.True(fd >= 0, $"socket failed: errno {Marshal.GetLastPInvokeError()}");
        try
        {
            // struct sockaddr_un: sa_family_t sun_family; char sun_path[108].
            var address = new byte[110];
            address[0] = AF_UNIX;
            var written = Encoding.UTF8.GetBytes(path, address.AsSpan(2));
            fixed (byte* pointer = address)
            {
                Assert.True(Bind(fd, pointer, (uint)(2 + written + 1)) == 0, $"bind failed: errno {Marshal.GetLastPInvokeError()}");
            }
        }
        finally
        {
            _ = Close(fd);
        }
    }

    [StructLayout(LayoutKind.Explicit, Size = 256)]
    private struct StatxResult
    {
        // struct statx (linux/stat.h): stx_ino is the __u64 at offset 32.
        [FieldOffset(32)]
        public ulong Ino;
    }

    [LibraryImport("libc", EntryPoint = "socket", SetLastError = true)]
    private static partial int Socket(int domain, int type, int protocol);

    [LibraryImport("libc", EntryPoint = "bind", SetLastError = true)]
    private static unsafe partial int Bind(int fd, byte* address, uint length);

    [LibraryImport("libc", EntryPoint = "close", SetLastError = true)]
    private static partial int Close(int fd);

    [LibraryImport("libc", EntryPoint = "statx", SetLastError = true, StringMarshalling = StringMarshalling.Utf8)]
    private static partial int Statx(int directoryFd, string path, int flags, uint mask, ref StatxResult result);
}
