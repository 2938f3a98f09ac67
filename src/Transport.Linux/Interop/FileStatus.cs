using System.Buffers.Binary;
using System.Runtime.InteropServices;

namespace Kestrel.Transport.Linux.Interop;

/// <summary>
/// statx(2) (Linux 4.11, glibc 2.28): unlike struct stat its layout is the same on every
/// architecture, so one declaration serves x86_64 and arm64.
/// </summary>
internal static unsafe partial class FileStatus
{
    private const int AT_FDCWD = -100;
    private const int AT_SYMLINK_NOFOLLOW = 0x100;
    private const uint STATX_TYPE = 0x1;
    private const uint STATX_INO = 0x100;
    private const int S_IFMT = 0xF000;
    public const int S_IFSOCK = 0xC000;
    public const int S_IFREG = 0x8000;

    [LibraryImport(LibC.Name, EntryPoint = "statx", SetLastError = true, StringMarshalling = StringMarshalling.Utf8)]
    private static partial int statx(int dirfd, string path, int flags, uint mask, byte* buffer);

    /// <summary>The file type bits (S_IFMT) and inode of <paramref name="path"/>, not following a final symlink; -errno on failure.</summary>
    public static int TryGet(string path, out int type, out ulong inode)
    {
        byte* buffer = stackalloc byte[256];
        int rc = Errno.Check(statx(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, STATX_TYPE | STATX_INO, buffer));
        var span = new ReadOnlySpan<byte>(buffer, 256);
        type = rc == 0 ? BinaryPrimitives.ReadUInt16LittleEndian(span[28..]) & S_IFMT : 0;  // stx_mode
        inode = rc == 0 ? BinaryPrimitives.ReadUInt64LittleEndian(span[32..]) : 0;         // stx_ino
        return rc;
    }
}
