using System.Runtime.InteropServices;

namespace LibuvComparator.Interop;

/// <summary>
/// The libuv entry points, bound by name to the system's <c>libuv.so.1</c>. Handles and requests are
/// opaque blocks sized by <see cref="uv_handle_size"/> and <see cref="uv_req_size"/>; callbacks are
/// <c>[UnmanagedCallersOnly]</c> function pointers. Every call except <see cref="uv_async_send"/>
/// must be made on the thread that runs the loop.
/// </summary>
internal static unsafe partial class Uv
{
    public const string LibraryName = "libuv.so.1";

    /// <summary>uv_tcp_close_reset arrived in libuv 1.32.0 (ChangeLog); uv_version() is (major &lt;&lt; 16) | (minor &lt;&lt; 8) | patch.</summary>
    private const uint MinimumVersion = (1 << 16) | (32 << 8);

    private static readonly Lazy<DllNotFoundException?> s_loadError = new(ProbeLibrary);

    /// <summary>Throws a clear error when libuv1 is missing or too old, instead of a DllNotFoundException mid-bind.</summary>
    public static void EnsureAvailable()
    {
        if (s_loadError.Value is { } error)
        {
            throw error;
        }
    }

    /// <summary>The running library's uv_version_string(), for reports.</summary>
    public static string VersionString()
    {
        EnsureAvailable();
        return Marshal.PtrToStringUTF8(uv_version_string()) ?? "unknown";
    }

    /// <summary>uv_strerror(code) for messages.</summary>
    public static string Describe(int code) => $"{Marshal.PtrToStringUTF8(uv_err_name(code))}: {Marshal.PtrToStringUTF8(uv_strerror(code))}";

    private static DllNotFoundException? ProbeLibrary()
    {
        if (!NativeLibrary.TryLoad(LibraryName, typeof(Uv).Assembly, null, out _))
        {
            return new DllNotFoundException("libuv1 is not installed (apt-get install libuv1)");
        }

        uint version = uv_version();
        return version < MinimumVersion
            ? new DllNotFoundException($"libuv {Marshal.PtrToStringUTF8(uv_version_string())} is too old: the comparator needs 1.32 or later (uv_tcp_close_reset).")
            : null;
    }

    // ---- Loop ----------------------------------------------------------------------------------

    [LibraryImport(LibraryName)]
    public static partial nuint uv_loop_size();

    [LibraryImport(LibraryName)]
    public static partial int uv_loop_init(nint loop);

    [LibraryImport(LibraryName)]
    public static partial int uv_loop_close(nint loop);

    [LibraryImport(LibraryName)]
    public static partial int uv_run(nint loop, UvRunMode mode);

    [LibraryImport(LibraryName)]
    public static partial void uv_stop(nint loop);

    [LibraryImport(LibraryName)]
    public static partial void uv_walk(nint loop, delegate* unmanaged<nint, nint, void> walkCallback, nint arg);

    // ---- Handles and requests --------------------------------------------------------------------

    [LibraryImport(LibraryName)]
    public static partial nuint uv_handle_size(UvHandleType type);

    [LibraryImport(LibraryName)]
    public static partial nuint uv_req_size(UvReqType type);

    // The four data accessors only read or write the struct's first field: no GC transition needed.
    [LibraryImport(LibraryName)]
    [SuppressGCTransition]
    public static partial nint uv_handle_get_data(nint handle);

    [LibraryImport(LibraryName)]
    [SuppressGCTransition]
    public static partial void uv_handle_set_data(nint handle, nint data);

    [LibraryImport(LibraryName)]
    [SuppressGCTransition]
    public static partial nint uv_req_get_data(nint req);

    [LibraryImport(LibraryName)]
    [SuppressGCTransition]
    public static partial void uv_req_set_data(nint req, nint data);

    [LibraryImport(LibraryName)]
    public static partial int uv_is_closing(nint handle);

    [LibraryImport(LibraryName)]
    public static partial void uv_close(nint handle, delegate* unmanaged<nint, void> closeCallback);

    [LibraryImport(LibraryName)]
    public static partial int uv_fileno(nint handle, int* fd);

    // ---- Async (cross-thread wake-up) ------------------------------------------------------------

    [LibraryImport(LibraryName)]
    public static partial int uv_async_init(nint loop, nint async, delegate* unmanaged<nint, void> asyncCallback);

    /// <summary>The one thread-safe call; coalesces: many sends before the loop wakes run the callback once.</summary>
    [LibraryImport(LibraryName)]
    public static partial int uv_async_send(nint async);

    // ---- TCP and streams -------------------------------------------------------------------------

    [LibraryImport(LibraryName)]
    public static partial int uv_tcp_init(nint loop, nint tcp);

    [LibraryImport(LibraryName)]
    public static partial int uv_tcp_open(nint tcp, int fd);

    [LibraryImport(LibraryName)]
    public static partial int uv_tcp_nodelay(nint tcp, int enable);

    [LibraryImport(LibraryName)]
    public static partial int uv_tcp_getsockname(nint tcp, byte* name, int* length);

    [LibraryImport(LibraryName)]
    public static partial int uv_tcp_getpeername(nint tcp, byte* name, int* length);

    [LibraryImport(LibraryName)]
    public static partial int uv_tcp_close_reset(nint tcp, delegate* unmanaged<nint, void> closeCallback);

    [LibraryImport(LibraryName)]
    public static partial int uv_listen(nint stream, int backlog, delegate* unmanaged<nint, int, void> connectionCallback);

    [LibraryImport(LibraryName)]
    public static partial int uv_accept(nint server, nint client);

    [LibraryImport(LibraryName)]
    public static partial int uv_read_start(nint stream, delegate* unmanaged<nint, nuint, UvBuf*, void> allocCallback, delegate* unmanaged<nint, nint, UvBuf*, void> readCallback);

    [LibraryImport(LibraryName)]
    public static partial int uv_read_stop(nint stream);

    [LibraryImport(LibraryName)]
    public static partial int uv_write(nint req, nint stream, UvBuf* buffers, uint count, delegate* unmanaged<nint, int, void> writeCallback);

    [LibraryImport(LibraryName)]
    public static partial int uv_shutdown(nint req, nint stream, delegate* unmanaged<nint, int, void> shutdownCallback);

    // ---- Version and errors ----------------------------------------------------------------------

    [LibraryImport(LibraryName)]
    public static partial uint uv_version();

    [LibraryImport(LibraryName)]
    public static partial nint uv_version_string();

    [LibraryImport(LibraryName)]
    public static partial nint uv_strerror(int error);

    [LibraryImport(LibraryName)]
    public static partial nint uv_err_name(int error);
}
