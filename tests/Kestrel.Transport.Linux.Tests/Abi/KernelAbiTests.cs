using System.Reflection;
using System.Runtime.InteropServices;
using System.Runtime.Loader;
using Kestrel.Transport.Linux.Interop;

namespace Kestrel.Transport.Linux.Tests.Abi;

/// <summary>
/// Interop/ writes the kernel's constants and struct layouts down by hand. Tmds.LibC, a package of raw bindings
/// with a build per architecture, states them independently: its linux-x64 and linux-arm64 builds are loaded
/// here from files (nothing references them at run time), and every kernel constant and struct the transport
/// declares must agree with both. The transport does not ship on Tmds.LibC itself: docs/architecture.md says why.
/// </summary>
public sealed class KernelAbiTests
{
    /// <summary>The interop types whose ALL_CAPS constants are kernel or libc names.</summary>
    private static readonly Type[] s_declaringTypes =
        [typeof(Epoll), typeof(Interop.Socket), typeof(ErrorQueue), typeof(EventFd), typeof(LibC), typeof(FileStatus), typeof(Errno), typeof(Affinity)];

    /// <summary>
    /// Our constants that Tmds.LibC 0.5.0 (2020) does not name: the epoll busy-poll ioctls came with Linux 6.9,
    /// and it binds clock_gettime without the clock ids (CLOCK_THREAD_CPUTIME_ID is 3 in the kernel's
    /// include/uapi/linux/time.h on every architecture). A constant missing from it must be listed here, so each one is looked at.
    /// </summary>
    private static readonly HashSet<string> s_notInTmds = ["CLOCK_THREAD_CPUTIME_ID", "EPIOCGPARAMS", "EPIOCSPARAMS"];

    public static TheoryData<string> Architectures => new() { "linux-x64", "linux-arm64" };

    [Theory]
    [MemberData(nameof(Architectures))]
    public void Every_kernel_constant_has_the_value_Tmds_LibC_gives_it(string architecture)
    {
        var libc = LoadTmds(architecture).GetType("Tmds.Linux.LibC", throwOnError: true)!;
        var mismatches = new List<string>();
        var missing = new List<string>();
        int compared = 0;
        foreach (var field in s_declaringTypes.SelectMany(static t => t.GetFields(BindingFlags.Public | BindingFlags.NonPublic | BindingFlags.Static)))
        {
            if (!field.IsLiteral || !field.Name.Equals(field.Name.ToUpperInvariant(), StringComparison.Ordinal))
            {
                continue;
            }

            var member = (MemberInfo?)libc.GetProperty(field.Name, BindingFlags.Public | BindingFlags.Static) ?? libc.GetField(field.Name, BindingFlags.Public | BindingFlags.Static);
            if (member is null)
            {
                missing.Add(field.Name);
                continue;
            }

            long ours = ToInt64(field.GetRawConstantValue()!);
            long theirs = ToInt64(member is PropertyInfo p ? p.GetValue(null)! : ((FieldInfo)member).GetValue(null)!);
            compared++;
            if (Normalize(ours) != Normalize(theirs))
            {
                mismatches.Add($"{field.DeclaringType!.Name}.{field.Name} = {ours:X}, Tmds.LibC ({architecture}) says {theirs:X}");
            }
        }

        Assert.True(compared > 60, $"Only {compared} constants were compared: the reflection found too little to prove anything.");
        Assert.Empty(mismatches);
        Assert.Equal(s_notInTmds.Order(), missing.Order());
    }

    /// <summary>struct epoll_event is packed on x86_64 only: 12 bytes with data at 4 there, 16 with data at 8 on arm64.</summary>
    [Theory]
    [InlineData("linux-x64", Architecture.X64)]
    [InlineData("linux-arm64", Architecture.Arm64)]
    public void The_epoll_event_layout_for_each_architecture_is_the_one_Tmds_LibC_builds_for_it(string architecture, Architecture processor)
    {
        var epollEvent = LoadTmds(architecture).GetType("Tmds.Linux.epoll_event", throwOnError: true)!;
        var (size, dataOffset) = Epoll.LayoutFor(processor);
        Assert.Equal(Marshal.SizeOf(epollEvent), size);
        Assert.Equal((int)Marshal.OffsetOf(epollEvent, "data"), dataOffset);
    }

    public static TheoryData<string, Type, string> Structs
    {
        get
        {
            var data = new TheoryData<string, Type, string>();
            foreach (string architecture in new[] { "linux-x64", "linux-arm64" })
            {
                data.Add(architecture, typeof(Iovec), "Tmds.Linux.iovec");
                data.Add(architecture, typeof(Interop.Socket.MessageHeader), "Tmds.Linux.msghdr");
                data.Add(architecture, typeof(Interop.Socket.Linger), "Tmds.Linux.linger");
                data.Add(architecture, typeof(ErrorQueue.ControlMessageHeader), "Tmds.Linux.cmsghdr");
                data.Add(architecture, typeof(ErrorQueue.ExtendedError), "Tmds.Linux.sock_extended_err");
                data.Add(architecture, typeof(FileStatus.Statx), "Tmds.Linux.statx");
            }

            return data;
        }
    }

    /// <summary>
    /// Each struct the transport hands the kernel has the size of Tmds.LibC's, and its fields sit where Tmds.LibC's
    /// first fields do, in order (Statx declares only the fields it reads, then pads to the kernel's 256 bytes).
    /// </summary>
    [Theory]
    [MemberData(nameof(Structs))]
    public void Each_kernel_struct_has_the_size_and_field_offsets_Tmds_LibC_gives_it(string architecture, Type ours, string theirsName)
    {
        var theirs = LoadTmds(architecture).GetType(theirsName, throwOnError: true)!;
        Assert.Equal(Marshal.SizeOf(theirs), Marshal.SizeOf(ours));

        var ourOffsets = Offsets(ours);
        var theirOffsets = Offsets(theirs);
        Assert.True(ourOffsets.Count <= theirOffsets.Count, $"{ours.Name} has {ourOffsets.Count} fields, {theirsName} only {theirOffsets.Count}.");
        Assert.Equal(theirOffsets.Take(ourOffsets.Count), ourOffsets);
    }

    private static List<int> Offsets(Type type) =>
        [.. type.GetFields(BindingFlags.Instance | BindingFlags.Public | BindingFlags.NonPublic)
            .Select(f => (int)Marshal.OffsetOf(type, f.Name))
            .Order()];

    /// <summary>EPOLLET is 1u &lt;&lt; 31 here and int.MinValue there: a value that fits 32 bits compares as those bits.</summary>
    private static long Normalize(long value) => value is >= int.MinValue and <= uint.MaxValue ? unchecked((uint)value) : value;

    private static long ToInt64(object value)
    {
        // Tmds.LibC wraps some constants in one-field structs (sa_family_t for AF_*).
        if (value.GetType() is { IsPrimitive: false, IsValueType: true } wrapper)
        {
            value = wrapper.GetFields(BindingFlags.Instance | BindingFlags.Public | BindingFlags.NonPublic).Single().GetValue(value)!;
        }

        return value switch
        {
            uint u => u,
            ulong ul => unchecked((long)ul),
            nuint n => unchecked((long)n),
            _ => Convert.ToInt64(value, System.Globalization.CultureInfo.InvariantCulture),
        };
    }

    private static readonly Dictionary<string, Assembly> s_loaded = [];

    /// <summary>One architecture's build, in a load context of its own (both have the same identity).</summary>
    private static Assembly LoadTmds(string architecture)
    {
        lock (s_loaded)
        {
            if (!s_loaded.TryGetValue(architecture, out var assembly))
            {
                string path = Path.Combine(AppContext.BaseDirectory, "tmds-libc", architecture, "Tmds.LibC.dll");
                Assert.True(File.Exists(path), $"{path} is missing: the test project copies it from the Tmds.LibC package.");
                assembly = new AssemblyLoadContext($"tmds-{architecture}", isCollectible: false).LoadFromAssemblyPath(path);
                s_loaded[architecture] = assembly;
            }

            return assembly;
        }
    }
}
