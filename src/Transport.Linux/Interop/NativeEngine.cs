using System.Runtime.InteropServices;

namespace Kestrel.Transport.Linux.Interop;

/// <summary>
/// One socket's share of a batch: mirrors <c>ktl_op</c> in src/Native/include/ktl.h (32 bytes on LP64).
/// </summary>
[StructLayout(LayoutKind.Sequential)]
internal unsafe struct IoOp
{
    public int Fd;
    public int IovCount;
    public Iovec* Iov;
    /// <summary>Bytes transferred (0 = EOF on a receive), or -errno.</summary>
    public long Result;
    /// <summary><see cref="NativeEngine.SendZeroCopy"/> or 0.</summary>
    public int Flags;
    /// <summary>
    /// In: a zero-copy send's number for its ring notification (<see cref="NativeEngine.RingSendDone"/>), else 0.
    /// Out, after a ring batch: 0 unless that notification will come (then the kernel may read the buffers until it does).
    /// </summary>
    public uint Tag;
}

/// <summary>What a ring is and what the kernel offers: mirrors <c>ktl_ring_info</c>.</summary>
[StructLayout(LayoutKind.Sequential)]
internal struct RingInfo
{
    /// <summary>IORING_SETUP_* flags in use.</summary>
    public uint Setup;
    /// <summary>IORING_FEAT_* flags of the kernel.</summary>
    public uint Features;
    public uint SubmissionEntries;
    public uint CompletionEntries;
    /// <summary>KTL_RING_* ability bits (<see cref="NativeEngine.RingSendsZeroCopy"/>), known once the ring has started.</summary>
    public uint Abilities;
    private readonly uint _reserved;
}

/// <summary>One poll completion: mirrors <c>ktl_cqe</c> (16 bytes).</summary>
[StructLayout(LayoutKind.Sequential)]
internal struct RingCompletion
{
    public ulong UserData;
    /// <summary>The ready events (epoll/poll bits), or -errno.</summary>
    public int Result;
    public uint Flags;
}

/// <summary>The native batch engine, libktl_native.so (src/Native). Everything here mirrors ktl.h.</summary>
internal static unsafe partial class NativeEngine
{
    public const string LibraryName = "ktl_native";
    public const int AbiVersion = 7;
    public const int Receive = 0;
    public const int Send = 1;

    /// <summary>KTL_SEND_ZEROCOPY: the send goes out with MSG_ZEROCOPY (see ZeroCopySends).</summary>
    public const int SendZeroCopy = 1;

    private static readonly Lazy<string?> s_loadError = new(TryLoad);

    /// <summary>True when libktl_native.so is loadable and speaks this ABI version.</summary>
    public static bool IsSupported => s_loadError.Value is null;

    /// <summary>Why the native engine is not in use, or null when it is.</summary>
    public static string? LoadError => s_loadError.Value;

    [LibraryImport(LibraryName, EntryPoint = "ktl_abi_version")]
    private static partial int ktl_abi_version();

    [LibraryImport(LibraryName, EntryPoint = "ktl_engine_create")]
    public static partial nint ktl_engine_create(int aioCapacity, int* aioError);

    [LibraryImport(LibraryName, EntryPoint = "ktl_engine_has_aio")]
    public static partial int ktl_engine_has_aio(nint engine);

    [LibraryImport(LibraryName, EntryPoint = "ktl_engine_destroy")]
    public static partial void ktl_engine_destroy(nint engine);

    [LibraryImport(LibraryName, EntryPoint = "ktl_batch")]
    public static partial int ktl_batch(nint engine, int direction, int useAio, IoOp* ops, int count);

    /// <summary>KTL_CQE_MORE (IORING_CQE_F_MORE): the multishot poll is still armed.</summary>
    public const uint CqeMore = 2;

    /// <summary>IORING_SETUP_* flags a ring may report in <see cref="RingInfo.Setup"/>.</summary>
    public const uint SetupCoopTaskRun = 1u << 8, SetupSingleIssuer = 1u << 12, SetupDeferTaskRun = 1u << 13;

    [LibraryImport(LibraryName, EntryPoint = "ktl_ring_supported")]
    public static partial int ktl_ring_supported();

    [LibraryImport(LibraryName, EntryPoint = "ktl_ring_create")]
    public static partial nint ktl_ring_create(int entries, uint flags, RingInfo* info, int* error);

    /// <summary>ktl_ring_create: the ring will be entered by several threads, one at a time (KTL_RING_MOVABLE).</summary>
    public const uint RingMovable = 1;

    [LibraryImport(LibraryName, EntryPoint = "ktl_ring_start")]
    public static partial int ktl_ring_start(nint ring, int wakeFd, RingInfo* info);

    [LibraryImport(LibraryName, EntryPoint = "ktl_ring_poll")]
    public static partial int ktl_ring_poll(nint ring, int fd, uint events, ulong userData);

    /// <summary>KTL_RING_ACCEPT: the user data of an accept (<see cref="ktl_ring_accept"/>) has this bit.</summary>
    public const ulong RingAccept = 1ul << 62;

    /// <summary>
    /// KTL_RING_SEND_DONE: a completion with this bit is a zero-copy send's notification; the low 32 bits are the
    /// op's <see cref="IoOp.Tag"/>, and the result is 1 when the kernel copied after all.
    /// </summary>
    public const ulong RingSendDone = 1ul << 61;

    /// <summary>KTL_RING_SENDS_ZEROCOPY: a ring batch's zero-copy sends are IORING_OP_SENDMSG_ZC (Linux 6.2).</summary>
    public const uint RingSendsZeroCopy = 1;

    [LibraryImport(LibraryName, EntryPoint = "ktl_ring_accept")]
    public static partial int ktl_ring_accept(nint ring, int fd, ulong userData);

    [LibraryImport(LibraryName, EntryPoint = "ktl_ring_remove")]
    public static partial int ktl_ring_remove(nint ring, ulong userData, int wait);

    [LibraryImport(LibraryName, EntryPoint = "ktl_ring_remove_all")]
    public static partial int ktl_ring_remove_all(nint ring, ulong* userData, int count);

    [LibraryImport(LibraryName, EntryPoint = "ktl_ring_wait")]
    public static partial int ktl_ring_wait(nint ring, int timeoutMs, RingCompletion* events, int capacity);

    [LibraryImport(LibraryName, EntryPoint = "ktl_ring_batch")]
    public static partial int ktl_ring_batch(nint ring, int direction, IoOp* ops, int count);

    [LibraryImport(LibraryName, EntryPoint = "ktl_ring_destroy")]
    public static partial void ktl_ring_destroy(nint ring);

    private static string? TryLoad()
    {
        if (!OperatingSystem.IsLinux())
        {
            return "not Linux";
        }

        try
        {
            int version = ktl_abi_version();
            return version == AbiVersion ? null : $"lib{LibraryName}.so speaks ABI {version}, this assembly needs {AbiVersion}";
        }
        catch (DllNotFoundException e)
        {
            return $"lib{LibraryName}.so could not be loaded: {e.Message}";
        }
        catch (EntryPointNotFoundException e)
        {
            return $"lib{LibraryName}.so is not the Kestrel.Transport.Linux engine: {e.Message}";
        }
    }
}
