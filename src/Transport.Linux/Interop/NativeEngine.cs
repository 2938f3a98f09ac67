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
    private readonly int _reserved; // must be 0
}

/// <summary>The native batch engine, libktl_native.so (src/Native). Everything here mirrors ktl.h.</summary>
internal static unsafe partial class NativeEngine
{
    public const string LibraryName = "ktl_native";
    public const int AbiVersion = 2;
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
