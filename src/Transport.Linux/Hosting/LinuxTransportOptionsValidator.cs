using Microsoft.Extensions.Options;

namespace Kestrel.Transport.Linux.Hosting;

internal sealed class LinuxTransportOptionsValidator : IValidateOptions<LinuxTransportOptions>
{
    public ValidateOptionsResult Validate(string? name, LinuxTransportOptions options)
    {
        var failures = options.Validate().ToList();
        return failures.Count == 0 ? ValidateOptionsResult.Success : ValidateOptionsResult.Fail(failures);
    }
}
