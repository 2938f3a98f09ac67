namespace LibuvComparator.Interop;

// Every libuv number the comparator needs, in one place. They come from the headers of libuv1-dev
// 1.44.2 (Debian 12): /usr/include/uv.h for the enums, /usr/include/uv/errno.h for the error codes.
// The enums are positional (UV_HANDLE_TYPE_MAP and UV_REQ_TYPE_MAP, after a 0 "unknown" entry).
// On Linux UV__ERR(e) is -e, so most error codes are the negated errno; UV_EOF is libuv's own.

/// <summary>uv_handle_type.</summary>
internal enum UvHandleType
{
    Async = 1,
    Tcp = 12,
}

/// <summary>uv_req_type.</summary>
internal enum UvReqType
{
    Write = 3,
    Shutdown = 4,
}

/// <summary>uv_run_mode.</summary>
internal enum UvRunMode
{
    Default = 0,
    Once = 1,
    NoWait = 2,
}

/// <summary>uv_errno_t values used by the transport.</summary>
internal static class UvError
{
    public const int EAGAIN = -11;
    public const int EBUSY = -16;
    public const int EINVAL = -22;
    public const int EPIPE = -32;
    public const int ECONNRESET = -104;
    public const int ENOBUFS = -105;
    public const int ECANCELED = -125;
    public const int EOF = -4095;
}
