using System.Runtime.InteropServices;

namespace LibuvComparator.Interop;

/// <summary>uv_buf_t on Unix: <c>{ char* base; size_t len; }</c>, base first, the layout of struct iovec (uv/unix.h).</summary>
[StructLayout(LayoutKind.Sequential)]
internal unsafe struct UvBuf
{
    public byte* Base;
    public nuint Length;
}
