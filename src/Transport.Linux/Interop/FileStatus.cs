using System.Runtime.InteropServices;

namespace Kestrel.Transport.Linux.Interop;

/// <summary>
/// statx(2) (Linux 4.11, glibc 2.28): unlike struct stat its layout is the same on every architecture,
/// so one declaration serves x86_64 and arm64.
/// </summary>
internal static unsafe partial class FileStatus
{
    public const int S_IFMT = 0xF000;
    public const int S_IFSOCK = 0xC000;
    public const int S_IFREG = 0x8000;

    private const int AT_FDCWD = -100;
    private const int AT_SYMLINK_NOFOLLOW = 0x100;
    private const uint STATX_TYPE = 0x1;
    private const uint STATX_INO = 0x100;

    [LibraryImport(LibC.Name, EntryPoint = "statx", SetLastError = true, StringMarshalling = StringMarshalling.Utf8)]
    private static partial int statx(int dirfd, string path, int flags, uint mask, Statx* buffer);

    /// <summary>The file type bits (S_IFMT) and inode of <paramref name="path"/>, not following a final symlink.</summary>
    public static SysResult TryGet(string path, out int type, out ulong inode)
    {
        Statx status = default;
        var result = SysResult.Of(statx(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, STATX_TYPE | STATX_INO, &status));
        type = result.IsError ? 0 : status.Mode & S_IFMT;
        inode = result.IsError ? 0 : status.Inode;
        return result;
    }

    /// <summary>
    /// struct statx (linux/stat.h), up to the fields read here; the kernel writes at most its full 256 bytes.
    /// </summary>
    [StructLayout(LayoutKind.Sequential, Size = 256)]
    internal struct Statx
    {
        public uint Mask;             // stx_mask
        public uint BlockSize;        // stx_blksize
        public ulong Attributes;      // stx_attributes
        public uint Links;            // stx_nlink
        public uint Uid;              // stx_uid
        public uint Gid;              // stx_gid
        public ushort Mode;           // stx_mode, offset 28
        private readonly ushort _spare0;
        public ulong Inode;           // stx_ino, offset 32
    }
}
