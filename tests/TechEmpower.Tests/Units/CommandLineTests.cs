using TechEmpower.Tests.Infrastructure;

namespace TechEmpower.Tests.Units;

/// <summary>The built sample's exit codes: the same parser, seen from a shell.</summary>
public sealed class CommandLineTests
{
    [Theory]
    [InlineData("Unknown transport 'uring'", "--transport", "uring")]
    [InlineData("Unknown mode 'raw'", "--mode", "raw")]
    [InlineData("Invalid thread count '0'", "--threads", "0")]
    [InlineData("Unknown option '--port'", "--port", "80")]
    [InlineData("Platform mode serves plain HTTP only", "--mode", "platform", "--urls", "https://127.0.0.1:0")]
    public async Task Bad_command_lines_exit_2_with_the_error_and_the_usage(string message, params string[] args)
    {
        var (exitCode, output) = await SampleProcess.RunToExitAsync(args);
        Assert.Equal(SampleOptions.UsageExitCode, exitCode);
        Assert.Contains($"error: {message}", output, StringComparison.Ordinal);
        Assert.Contains("Usage: TechEmpower", output, StringComparison.Ordinal);
    }

    /// <summary>
    /// <c>--tuning</c> reaches the transport's own switches (through TransportTuning.cs, not InternalsVisibleTo): a
    /// value the parser takes but the transport's validation refuses stops the server at start-up, naming it.
    /// </summary>
    [Fact]
    public async Task Tuning_reaches_the_transport_whose_validation_refuses_an_out_of_range_switch()
    {
        var (exitCode, output) = await SampleProcess.RunToExitAsync(
            ["--urls", "http://127.0.0.1:0", "--transport", "linux", "--tuning", "MaxBytesPerRead=1024"]);
        Assert.True(exitCode != 0 && exitCode != SampleOptions.UsageExitCode, $"Expected a failed start, not exit code {exitCode}:{Environment.NewLine}{output}");
        Assert.Contains("TransportTuning.MaxBytesPerRead must be between 2048 and 1048576, but was 1024", output, StringComparison.Ordinal);
    }

    /// <summary>A certificate that does not load is a usage error too, named before the server starts.</summary>
    [Theory]
    [InlineData("missing-file")]
    [InlineData("missing-key")]
    [InlineData("wrong-pfx-password")]
    [InlineData("pfx-without-password")]
    [InlineData("wrong-key-password")]
    [InlineData("pem-without-key")]
    [InlineData("key-of-another-certificate")]
    public async Task A_certificate_that_does_not_load_exits_2_naming_the_file(string problem)
    {
        using var files = TestCertificates.Create(rsa: true);
        using var other = TestCertificates.Create(rsa: true);
        var missing = Path.Combine(files.Folder, "missing.pfx");
        var (arguments, message) = problem switch
        {
            "missing-file" => (new[] { "--certificate", missing }, $"The certificate file '{missing}' does not exist."),
            "missing-key" => (["--certificate", files.CertificatePem, "--certificate-key", missing], $"The certificate file '{missing}' does not exist."),
            "wrong-pfx-password" => (["--certificate", files.Pfx, "--certificate-password", "wrong"], $"The certificate '{files.Pfx}' cannot be loaded:"),
            "pfx-without-password" => (["--certificate", files.Pfx], $"The certificate '{files.Pfx}' cannot be loaded:"),
            "wrong-key-password" => (["--certificate", files.CertificatePem, "--certificate-key", files.EncryptedKeyPem, "--certificate-password", "wrong"],
                $"The certificate '{files.CertificatePem}' with key '{files.EncryptedKeyPem}' cannot be loaded:"),
            "pem-without-key" => (["--certificate", files.CertificatePem], $"The PEM file '{files.CertificatePem}' holds no private key"),
            _ => (["--certificate", files.CertificatePem, "--certificate-key", other.KeyPem],
                $"The certificate '{files.CertificatePem}' with key '{other.KeyPem}' cannot be loaded:"),
        };

        var (exitCode, output) = await SampleProcess.RunToExitAsync(["--urls", "https://127.0.0.1:0", .. arguments]);

        Assert.True(exitCode == SampleOptions.UsageExitCode, $"Exit code {exitCode}:{Environment.NewLine}{output}");
        Assert.Contains($"error: {message}", output, StringComparison.Ordinal);
        Assert.DoesNotContain("TechEmpower: ", output, StringComparison.Ordinal);
    }

    [Fact]
    public async Task Help_exits_0_with_the_usage()
    {
        var (exitCode, output) = await SampleProcess.RunToExitAsync(["--help"]);
        Assert.Equal(0, exitCode);
        Assert.Contains("--transport NAME", output, StringComparison.Ordinal);
    }

    [Fact]
    public async Task Sockets_inline_refuses_an_environment_that_turns_inline_completions_off()
    {
        var (exitCode, output) = await SampleProcess.RunToExitAsync(
            ["--transport", "sockets-inline", "--urls", "http://127.0.0.1:0"],
            new Dictionary<string, string?> { ["DOTNET_SYSTEM_NET_SOCKETS_INLINE_COMPLETIONS"] = "0" });
        Assert.Equal(SampleOptions.UsageExitCode, exitCode);
        Assert.Contains("DOTNET_SYSTEM_NET_SOCKETS_INLINE_COMPLETIONS=1", output, StringComparison.Ordinal);
    }

    [Fact]
    public void Libuv_is_installed() => LibuvFixture.RequireLibuv();
}
