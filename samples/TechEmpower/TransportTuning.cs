using System.Runtime.CompilerServices;
using Kestrel.Transport.Linux;

namespace TechEmpower;

/// <summary>
/// The Linux transport's internal measurement switches (its <c>TransportTuning</c>), for the benchmarks-only
/// <c>--tuning</c> argument. No public API and no configuration key reaches them, and the shipped assembly grants
/// its internals to no assembly of this name: the sample binds to the two members it needs with
/// <see cref="UnsafeAccessorAttribute"/>, by name, which takes nothing from the library and widens nothing a user
/// could reach. A renamed member fails the first <c>--tuning</c> parse with a MissingMethodException, which the
/// sample's tests (SampleOptionsTests) would report.
/// </summary>
internal static class TransportTuning
{
    private const string TuningType = "Kestrel.Transport.Linux.Hosting.TransportTuning, Kestrel.Transport.Linux";

    /// <summary>
    /// Applies <c>Name=value</c> pairs separated by commas to <paramref name="options"/>' switches, as the transport's
    /// own parser reads them. Returns null, or the error: an unknown name, or a value that does not parse.
    /// </summary>
    public static string? Apply(LinuxTransportOptions options, string settings) => Apply(Tuning(options), settings);

    /// <summary>Checks <paramref name="settings"/> without a server: null, or the error <see cref="Apply(LinuxTransportOptions, string)"/> would give.</summary>
    public static string? Check(string settings) => Apply(new LinuxTransportOptions(), settings);

    [UnsafeAccessor(UnsafeAccessorKind.Method, Name = "get_Tuning")]
    [return: UnsafeAccessorType(TuningType)]
    private static extern object Tuning(LinuxTransportOptions options);

    [UnsafeAccessor(UnsafeAccessorKind.Method, Name = "Apply")]
    private static extern string? Apply([UnsafeAccessorType(TuningType)] object tuning, string settings);
}
