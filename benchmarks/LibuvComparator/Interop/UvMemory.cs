using System.Runtime.CompilerServices;
using System.Runtime.InteropServices;

namespace LibuvComparator.Interop;

/// <summary>
/// Native blocks for libuv's opaque handles and requests, and the way back from one to its managed
/// owner: the block's <c>data</c> field holds a GCHandle to the owner (uv_handle_set_data, uv_req_set_data).
/// </summary>
internal static unsafe class UvMemory
{
    // Sizes of the running library, not of the headers we read (uv_handle_size, uv_req_size).
    private static readonly nuint s_tcpSize = Uv.uv_handle_size(UvHandleType.Tcp);
    private static readonly nuint s_asyncSize = Uv.uv_handle_size(UvHandleType.Async);
    private static readonly nuint s_writeSize = Uv.uv_req_size(UvReqType.Write);
    private static readonly nuint s_shutdownSize = Uv.uv_req_size(UvReqType.Shutdown);

    public static nint AllocateHandle(UvHandleType type) => (nint)NativeMemory.AllocZeroed(type switch
    {
        UvHandleType.Tcp => s_tcpSize,
        UvHandleType.Async => s_asyncSize,
        _ => throw new ArgumentOutOfRangeException(nameof(type)),
    });

    public static nint AllocateRequest(UvReqType type) => (nint)NativeMemory.AllocZeroed(type switch
    {
        UvReqType.Write => s_writeSize,
        UvReqType.Shutdown => s_shutdownSize,
        _ => throw new ArgumentOutOfRangeException(nameof(type)),
    });

    public static void Free(nint block)
    {
        if (block != 0)
        {
            NativeMemory.Free((void*)block);
        }
    }

    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    public static T HandleOwner<T>(nint handle) where T : class
        => Unsafe.As<T>(GCHandle.FromIntPtr(Uv.uv_handle_get_data(handle)).Target!);

    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    public static T RequestOwner<T>(nint req) where T : class
        => Unsafe.As<T>(GCHandle.FromIntPtr(Uv.uv_req_get_data(req)).Target!);

    /// <summary>Close callback for a handle that never got an owner (a failed accept): frees its block.</summary>
    [UnmanagedCallersOnly]
    public static void FreeOnClose(nint handle) => Free(handle);
}
