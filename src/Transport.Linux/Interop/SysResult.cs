using System.Globalization;
using System.Runtime.InteropServices;

namespace Kestrel.Transport.Linux.Interop;

/// <summary>
/// What one system call returned: a non-negative value (a byte count, an fd, 0 for success) or an errno.
/// Every call in Interop/ returns one, made from C's "-1 and errno" in one place (<see cref="Of(long)"/>);
/// the native engine's per-op results (bytes, or -errno) become one through <see cref="FromNative"/>. Unlike
/// the plain int it replaces, it cannot be passed where a count or an fd is expected: the value is read
/// through <see cref="Value"/>, which refuses an error.
/// </summary>
internal readonly struct SysResult
{
    // >= 0: the value; < 0: the negated errno. The native ABI's convention, so FromNative is free.
    private readonly long _raw;

    private SysResult(long raw) => _raw = raw;

    /// <summary>Success with value 0.</summary>
    public static SysResult Success => default;

    /// <summary>True when the call failed; <see cref="Error"/> says why.</summary>
    public bool IsError => _raw < 0;

    /// <summary>The errno of a failed call; 0 after a success.</summary>
    public int Error => _raw < 0 ? (int)-_raw : 0;

    /// <summary>The value of a successful call.</summary>
    /// <exception cref="InvalidOperationException">The call failed: there is no value.</exception>
    public long Value => _raw >= 0 ? _raw : throw new InvalidOperationException($"The call failed ({Errno.Describe(Error)}): it has no value.");

    /// <summary>The result of a call declared with <c>SetLastError = true</c>: -1 means the errno it left.</summary>
    public static SysResult Of(long returned) => returned == -1 ? Failed(Marshal.GetLastPInvokeError()) : new(returned);

    /// <inheritdoc cref="Of(long)"/>
    public static SysResult Of(int returned) => Of((long)returned);

    /// <inheritdoc cref="Of(long)"/>
    public static SysResult Of(nint returned) => Of((long)returned);

    /// <summary>A result in the native engine's form (ktl.h): bytes, or -errno.</summary>
    public static SysResult FromNative(long result) => new(result);

    /// <summary>A failure with <paramref name="errno"/> (positive).</summary>
    public static SysResult Failed(int errno) => new(-(long)Math.Max(errno, 1));

    /// <summary>True when the call failed with exactly <paramref name="errno"/>.</summary>
    public bool Is(int errno) => _raw == -(long)errno;

    /// <summary>The value, or the error as the exception <see cref="Errno.ToException"/> maps it to.</summary>
    public long ValueOrThrow(string operation) => _raw >= 0 ? _raw : throw Errno.ToException(Error, operation);

    /// <summary>The value of a call that returns an int (an fd, a count of events), or the error as an exception.</summary>
    public int IntOrThrow(string operation) => checked((int)ValueOrThrow(operation));

    /// <summary>"errno N" text for logs, or the value.</summary>
    public override string ToString() => IsError ? Errno.Describe(Error) : _raw.ToString(CultureInfo.InvariantCulture);
}
