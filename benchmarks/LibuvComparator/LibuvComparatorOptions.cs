using LibuvComparator.Interop;

namespace LibuvComparator;

/// <summary>Options of the libuv comparator transport; the defaults are the old libuv transport's and Kestrel's Sockets transport's.</summary>
public sealed class LibuvComparatorOptions
{
    /// <summary>
    /// The number of libuv loop threads, each with its own uv_loop_t and SO_REUSEPORT listener.
    /// Default: half the processors, clamped to 1..16, the old libuv transport's default.
    /// </summary>
    public int ThreadCount { get; set; } = Math.Clamp(Environment.ProcessorCount / 2, 1, 16);

    /// <summary>Set TCP_NODELAY on accepted connections (uv_tcp_nodelay). Default: true.</summary>
    public bool NoDelay { get; set; } = true;

    /// <summary>
    /// Bytes read from a socket that may wait for the application; when reached the loop stops
    /// reading (uv_read_stop) until it catches up. Null means unbounded. Default: 1 MiB.
    /// </summary>
    public long? MaxReadBufferSize { get; set; } = 1024 * 1024;

    /// <summary>
    /// Bytes the application may have buffered for sending before its flushes wait for the socket.
    /// Null means unbounded. Default: 64 KiB.
    /// </summary>
    public long? MaxWriteBufferSize { get; set; } = 64 * 1024;

    /// <summary>The listen(2) backlog of each loop's listening socket. Default: 512.</summary>
    public int Backlog { get; set; } = 512;

    /// <summary>
    /// The loaded libuv's uv_version_string(), for benchmark reports. Throws
    /// <see cref="DllNotFoundException"/> when libuv1 is not installed.
    /// </summary>
    public static string LibuvVersion => Uv.VersionString();
}
