using System.Globalization;
using System.Net;
using System.Net.Sockets;
using System.Runtime.InteropServices;
using System.Text;
using Microsoft.AspNetCore.Builder;
using Microsoft.AspNetCore.Hosting;
using Microsoft.AspNetCore.Hosting.Server;
using Microsoft.AspNetCore.Hosting.Server.Features;
using Microsoft.AspNetCore.Http;
using Microsoft.Extensions.DependencyInjection;
using Microsoft.Extensions.Logging;

namespace Kestrel.Transport.Linux.Reliability.Tests.PortsAndFiles;

/// <summary>
/// The server side of the IPv6-less host tests, run in a child process (the test assembly started with itself as
/// a startup hook), because making IPv6 unavailable cannot be undone inside the test process. It starts Kestrel
/// with ListenLocalhost and ListenAnyIP, checks from inside the same process what answers, and prints one
/// "CHECK name: value" line per fact for the parent test to assert.
/// </summary>
internal static partial class Ipv6LessChild
{
    public const string Variable = "KTL_IPV6LESS_CHILD";

    // linux/audit.h and the syscall tables of each architecture.
    private const uint AuditArchX8664 = 0xC000003E;
    private const uint AuditArchAarch64 = 0xC00000B7;
    private const int AfInet6 = 10;
    private const int Eafnosupport = 97;

    /// <summary>Runs the scenario in <see cref="Variable"/> ("kind,scenario,localhostPort,anyPort") and returns the exit code.</summary>
    public static int Run(string setting)
    {
        var parts = setting.Split(',');
        var kind = Enum.Parse<TransportKind>(parts[0]);
        var scenario = parts[1];
        var localhostPort = int.Parse(parts[2], CultureInfo.InvariantCulture);
        var anyPort = int.Parse(parts[3], CultureInfo.InvariantCulture);
        try
        {
            if (scenario == "no-ipv6-sockets")
            {
                RefuseIPv6Sockets();
            }

            Report("ipv6 socket", Probe(() =>
            {
                using var socket = new Socket(AddressFamily.InterNetworkV6, SocketType.Stream, ProtocolType.Tcp);
                socket.Bind(new IPEndPoint(IPAddress.IPv6Loopback, 0));
            }));

            RunServerAsync(kind, localhostPort, anyPort).GetAwaiter().GetResult();
            Report("result", "ok");
            return 0;
        }
        catch (Exception ex)
        {
            Report("result", $"failed: {ex.ToString().ReplaceLineEndings(" | ")}");
            return 1;
        }
    }

    private static async Task RunServerAsync(TransportKind kind, int localhostPort, int anyPort)
    {
        var builder = WebApplication.CreateSlimBuilder();
        builder.Logging.ClearProviders();
        builder.Logging.AddSimpleConsole(o => o.SingleLine = true);
        builder.Logging.SetMinimumLevel(LogLevel.Debug);
        builder.Logging.AddFilter("Microsoft.AspNetCore.Hosting", LogLevel.Warning);
        builder.WebHost.UseKestrel(options =>
        {
            options.ListenLocalhost(localhostPort);
            options.ListenAnyIP(anyPort);
        });
        if (kind.IsLinux())
        {
            builder.WebHost.UseLinuxTransport(options => kind.Configure(options));
        }

        await using var app = builder.Build();
        app.Run(context => context.Response.WriteAsync("served"));
        await app.StartAsync().WaitAsync(TestTimeouts.Default);
        Report("transport", app.Services.GetServices<Microsoft.AspNetCore.Connections.IConnectionListenerFactory>().Last().GetType().Name);
        var addresses = app.Services.GetRequiredService<IServer>().Features.Get<IServerAddressesFeature>()!.Addresses;
        Report("addresses", string.Join(' ', addresses.Order(StringComparer.Ordinal)));

        Report("ipv4 localhost", await AskAsync(new IPEndPoint(IPAddress.Loopback, localhostPort)));
        Report("ipv4 any", await AskAsync(new IPEndPoint(IPAddress.Loopback, anyPort)));
        Report("ipv6 localhost", await AskAsync(new IPEndPoint(IPAddress.IPv6Loopback, localhostPort)));
        await app.StopAsync().WaitAsync(TestTimeouts.Default);
    }

    private static async Task<string> AskAsync(IPEndPoint endPoint)
    {
        try
        {
            using var socket = await TestSockets.ConnectAsync(endPoint);
            await socket.SendAllAsync("GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"u8.ToArray());
            using var cts = new CancellationTokenSource(TestTimeouts.Default);
            var response = await new RawHttpConnection(socket).ReadResponseAsync(cts.Token);
            return $"{response.StatusCode} {Encoding.ASCII.GetString(response.Body)}";
        }
        catch (SocketException ex)
        {
            return $"unavailable ({ex.SocketErrorCode})";
        }
    }

    private static string Probe(Action action)
    {
        try
        {
            action();
            return "available";
        }
        catch (SocketException ex)
        {
            return $"unavailable ({ex.SocketErrorCode})";
        }
    }

    private static void Report(string name, string value) => Console.WriteLine($"CHECK {name}: {value}");

    /// <summary>
    /// Makes socket(AF_INET6, ...) fail with EAFNOSUPPORT in every thread of this process, as on a kernel booted
    /// with ipv6.disable=1: a seccomp filter, installed with TSYNC so that threads already running get it too.
    /// </summary>
    private static unsafe void RefuseIPv6Sockets()
    {
        var (arch, socketCall, seccompCall) = RuntimeInformation.ProcessArchitecture switch
        {
            Architecture.X64 => (AuditArchX8664, 41u, 317L),
            Architecture.Arm64 => (AuditArchAarch64, 198u, 277L),
            var other => throw new PlatformNotSupportedException($"No seccomp numbers for {other}."),
        };

        // struct seccomp_data: int nr at 0, __u32 arch at 4, __u64 args[6] from 16 (low half of args[0] at 16).
        SockFilter[] program =
        [
            Statement(0x20, 4),                             // ld [arch]
            Jump(0x15, arch, jumpIfTrue: 0, jumpIfFalse: 4), // not this architecture: allow
            Statement(0x20, 0),                             // ld [nr]
            Jump(0x15, socketCall, 0, 2),                   // not socket(2): allow
            Statement(0x20, 16),                            // ld [args[0]]
            Jump(0x15, AfInet6, 1, 0),                      // AF_INET6: refuse
            Statement(0x06, 0x7FFF0000),                    // ret SECCOMP_RET_ALLOW
            Statement(0x06, 0x00050000 | Eafnosupport),     // ret SECCOMP_RET_ERRNO | EAFNOSUPPORT
        ];

        if (Prctl(38 /* PR_SET_NO_NEW_PRIVS */, 1, 0, 0, 0) != 0)
        {
            throw new InvalidOperationException($"prctl(PR_SET_NO_NEW_PRIVS) failed: errno {Marshal.GetLastPInvokeError()}");
        }

        fixed (SockFilter* filter = program)
        {
            var fprog = new SockFprog { Length = (ushort)program.Length, Filter = filter };
            if (Syscall(seccompCall, 1 /* SECCOMP_SET_MODE_FILTER */, 1 /* SECCOMP_FILTER_FLAG_TSYNC */, (nint)(&fprog)) != 0)
            {
                throw new InvalidOperationException($"seccomp(SECCOMP_SET_MODE_FILTER) failed: errno {Marshal.GetLastPInvokeError()}");
            }
        }
    }

    private static SockFilter Statement(ushort code, uint k) => new() { Code = code, K = k };

    private static SockFilter Jump(ushort code, uint k, byte jumpIfTrue, byte jumpIfFalse) => new() { Code = code, K = k, JumpIfTrue = jumpIfTrue, JumpIfFalse = jumpIfFalse };

    [StructLayout(LayoutKind.Sequential)]
    private struct SockFilter
    {
        public ushort Code;
        public byte JumpIfTrue;
        public byte JumpIfFalse;
        public uint K;
    }

    [StructLayout(LayoutKind.Sequential)]
    private unsafe struct SockFprog
    {
        public ushort Length;
        public SockFilter* Filter;
    }

    [LibraryImport("libc", EntryPoint = "prctl", SetLastError = true)]
    private static partial int Prctl(int option, nuint arg2, nuint arg3, nuint arg4, nuint arg5);

    [LibraryImport("libc", EntryPoint = "syscall", SetLastError = true)]
    private static partial long Syscall(long number, long arg1, long arg2, nint arg3);
}
