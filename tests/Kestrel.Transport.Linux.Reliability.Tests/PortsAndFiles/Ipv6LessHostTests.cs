using System.Diagnostics;
using System.Net;
using System.Net.Sockets;

namespace Kestrel.Transport.Linux.Reliability.Tests.PortsAndFiles;

/// <summary>
/// Hosts without IPv6, where Kestrel must still bind "localhost" and ListenAnyIP on IPv4. Kestrel tries [::1]
/// for localhost and [::] for ListenAnyIP, and falls back only past exceptions that are not IOExceptions
/// (LocalhostListenOptions, AnyIPListenOptions): a transport that reports EADDRNOTAVAIL or EAFNOSUPPORT as an
/// IOException breaks the fallback, as the 2018 Linux transport did in containers. The server runs in a child
/// process, because IPv6 cannot be taken away from the test process and given back.
/// </summary>
public sealed class Ipv6LessHostTests(ITestOutputHelper output)
{
    public static TheoryData<TransportKind> Kinds => new() { TransportKind.Sockets, TransportKind.LinuxNative, TransportKind.LinuxManaged };

    /// <summary>
    /// In a network namespace with net.ipv6.conf.all.disable_ipv6=1 (Docker's default for containers without IPv6)
    /// [::1] cannot be bound (EADDRNOTAVAIL) while [::] still can: localhost binds 127.0.0.1 only and serves,
    /// ListenAnyIP binds the dual-stack [::] and serves IPv4 clients, and [::1] answers nothing.
    /// </summary>
    [NetworkNamespaceTheory]
    [MemberData(nameof(Kinds))]
    public async Task With_IPv6_disabled_by_sysctl_localhost_and_AnyIP_bind_and_serve_on_IPv4(TransportKind kind)
    {
        // A private network namespace has its own ports: fixed ones cannot collide with anything outside it.
        var checks = await RunChildAsync(kind, "ipv6-disabled", 5000, 5001, "unshare", "-rn", "sh", "-c",
            "ip link set lo up && echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6 && echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6 && exec \"$0\" \"$@\"");

        Assert.Equal("unavailable (AddressNotAvailable)", checks["ipv6 socket"]);
        Assert.Equal("http://[::]:5001 http://localhost:5000", checks["addresses"]);
        Assert.Equal("200 served", checks["ipv4 localhost"]);
        Assert.Equal("200 served", checks["ipv4 any"]);
        Assert.StartsWith("unavailable", checks["ipv6 localhost"], StringComparison.Ordinal);
        Assert.Equal("ok", checks["result"]);
    }

    /// <summary>
    /// With socket(AF_INET6) refused by EAFNOSUPPORT (a seccomp filter emulating a kernel booted with ipv6.disable=1),
    /// both of Kestrel's fallbacks must run: localhost binds 127.0.0.1 only, ListenAnyIP falls back from [::] to
    /// 0.0.0.0, and both serve IPv4 clients.
    /// </summary>
    [Theory]
    [MemberData(nameof(Kinds))]
    public async Task With_IPv6_sockets_refused_localhost_and_AnyIP_fall_back_to_IPv4(TransportKind kind)
    {
        var (localhostPort, anyPort) = (FreePort(), FreePort());
        var checks = await RunChildAsync(kind, "no-ipv6-sockets", localhostPort, anyPort);

        Assert.Equal("unavailable (AddressFamilyNotSupported)", checks["ipv6 socket"]);
        Assert.Equal($"http://0.0.0.0:{anyPort} http://localhost:{localhostPort}", checks["addresses"]);
        Assert.Equal("200 served", checks["ipv4 localhost"]);
        Assert.Equal("200 served", checks["ipv4 any"]);
        Assert.StartsWith("unavailable", checks["ipv6 localhost"], StringComparison.Ordinal);
        Assert.Equal("ok", checks["result"]);
    }

    private async Task<Dictionary<string, string>> RunChildAsync(TransportKind kind, string scenario, int localhostPort, int anyPort, params string[] wrapper)
    {
        kind.AssertEngineAvailable();
        var assembly = typeof(Ipv6LessChild).Assembly.Location;
        var dotnet = Environment.ProcessPath is { } path && Path.GetFileNameWithoutExtension(path) == "dotnet" ? path : "dotnet";
        var start = new ProcessStartInfo(wrapper.Length > 0 ? wrapper[0] : dotnet)
        {
            RedirectStandardOutput = true,
            RedirectStandardError = true,
            UseShellExecute = false,
        };
        foreach (var argument in wrapper.Skip(1).Concat(wrapper.Length > 0 ? [dotnet] : []).Append(assembly))
        {
            start.ArgumentList.Add(argument);
        }

        start.Environment["DOTNET_STARTUP_HOOKS"] = assembly;
        start.Environment[Ipv6LessChild.Variable] = $"{kind},{scenario},{localhostPort},{anyPort}";

        using var child = Process.Start(start)!;
        var stdout = child.StandardOutput.ReadToEndAsync();
        var stderr = child.StandardError.ReadToEndAsync();
        using (var cts = new CancellationTokenSource(TestTimeouts.Large))
        {
            try
            {
                await child.WaitForExitAsync(cts.Token);
            }
            catch (OperationCanceledException)
            {
                child.Kill(entireProcessTree: true);
                throw;
            }
        }

        var text = await stdout;
        output.WriteLine($"child ({string.Join(' ', start.ArgumentList.Prepend(start.FileName))}) exited {child.ExitCode}:\n{text}\nstderr:\n{await stderr}");
        var checks = text.Split('\n')
            .Where(line => line.StartsWith("CHECK ", StringComparison.Ordinal))
            .Select(line => line["CHECK ".Length..].Split(": ", 2))
            .ToDictionary(pair => pair[0], pair => pair[1].TrimEnd('\r'));
        Assert.True(checks.ContainsKey("result"), "The child reported no result (see its output above).");
        Assert.Equal(0, child.ExitCode);
        Assert.Equal(kind.IsLinux() ? "LinuxTransportFactory" : "SocketTransportFactory", checks["transport"]);
        return checks;
    }

    private static int FreePort()
    {
        using var socket = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
        socket.Bind(new IPEndPoint(IPAddress.Loopback, 0));
        return ((IPEndPoint)socket.LocalEndPoint!).Port;
    }
}

/// <summary>A theory skipped, with the reason, where an unprivileged network namespace cannot be created (`unshare -rn`).</summary>
public sealed class NetworkNamespaceTheoryAttribute : TheoryAttribute
{
    private static readonly Lazy<string?> s_unavailableReason = new(Probe);

    public NetworkNamespaceTheoryAttribute()
    {
        if (s_unavailableReason.Value is { } reason)
        {
            Skip = reason;
        }
    }

    private static string? Probe()
    {
        try
        {
            using var probe = Process.Start(new ProcessStartInfo("unshare", ["-rn", "sh", "-c", "ip link set lo up && echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6"])
            {
                RedirectStandardError = true,
                UseShellExecute = false,
            })!;
            probe.WaitForExit(10_000);
            return probe.ExitCode == 0 ? null : $"`unshare -rn` with ip and the disable_ipv6 sysctl failed here: {probe.StandardError.ReadToEnd().Trim()}";
        }
        catch (System.ComponentModel.Win32Exception ex)
        {
            return $"unshare could not be started: {ex.Message}";
        }
    }
}
